//! Samples, medians and tmpi/peer ratios.

use std::collections::BTreeMap;

use crate::spec::{Bench, Lib};

/// The median of `v` (the mean of the two middle values for an even count), or `None` for
/// an empty slice or one holding a NaN.
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() || v.iter().any(|x| x.is_nan()) {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 })
}

/// tmpi's value over the peer's, or `None` when either is missing, the peer's is zero or
/// the quotient is not finite. For latency a ratio below 1 means tmpi is faster; for
/// bandwidth and message rate a ratio above 1 does.
pub fn ratio(tmpi: Option<f64>, peer: Option<f64>) -> Option<f64> {
    let (t, p) = (tmpi?, peer?);
    let r = t / p;
    (p > 0.0 && r.is_finite()).then_some(r)
}

/// Every measured value, by benchmark, library and size, in the order measured.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    map: BTreeMap<(Bench, Lib, usize), Vec<f64>>,
}

impl Samples {
    /// Records one measurement.
    pub fn add(&mut self, bench: Bench, lib: Lib, size: usize, value: f64) {
        self.map.entry((bench, lib, size)).or_default().push(value);
    }

    /// The values of one (benchmark, library, size).
    pub fn get(&self, bench: Bench, lib: Lib, size: usize) -> &[f64] {
        self.map.get(&(bench, lib, size)).map_or(&[][..], Vec::as_slice)
    }

    /// The median of one (benchmark, library, size).
    pub fn median(&self, bench: Bench, lib: Lib, size: usize) -> Option<f64> {
        median(self.get(bench, lib, size))
    }

    /// Every size measured for `bench`, by any library, ascending.
    pub fn sizes(&self, bench: Bench) -> Vec<usize> {
        let mut v: Vec<usize> = self.map.keys().filter(|k| k.0 == bench).map(|k| k.2).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// (size, median) of `lib` for `bench`, ascending by size, sizes without data left out.
    pub fn curve(&self, bench: Bench, lib: Lib) -> Vec<(usize, f64)> {
        self.sizes(bench).into_iter().filter_map(|s| self.median(bench, lib, s).map(|m| (s, m))).collect()
    }

    /// Every sample as (benchmark, library, size, values).
    pub fn iter(&self) -> impl Iterator<Item = (Bench, Lib, usize, &[f64])> {
        self.map.iter().map(|(k, v)| (k.0, k.1, k.2, v.as_slice()))
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_bad_inputs() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.5]), Some(7.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
        // Outliers do not move it.
        assert_eq!(median(&[1.0, 1.1, 1000.0, 0.9, 1.05]), Some(1.05));
    }

    #[test]
    fn ratios_are_tmpi_over_peer() {
        assert_eq!(ratio(Some(1.0), Some(2.0)), Some(0.5));
        assert_eq!(ratio(Some(3.0), Some(1.5)), Some(2.0));
        assert_eq!(ratio(None, Some(2.0)), None);
        assert_eq!(ratio(Some(1.0), None), None);
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
    }

    #[test]
    fn samples_group_by_bench_lib_and_size() {
        let mut s = Samples::default();
        assert!(s.is_empty());
        for v in [5.0, 1.0, 3.0] {
            s.add(Bench::Latency, Lib::Tmpi, 8, v);
        }
        s.add(Bench::Latency, Lib::Mpich, 16, 2.0);
        s.add(Bench::Bw, Lib::Tmpi, 1, 9.0);
        assert_eq!(s.median(Bench::Latency, Lib::Tmpi, 8), Some(3.0));
        assert_eq!(s.get(Bench::Latency, Lib::Tmpi, 8), &[5.0, 1.0, 3.0]);
        assert_eq!(s.sizes(Bench::Latency), vec![8, 16]);
        assert_eq!(s.curve(Bench::Latency, Lib::Tmpi), vec![(8, 3.0)]);
        assert_eq!(s.curve(Bench::Latency, Lib::Ompi), vec![]);
        assert_eq!(s.median(Bench::Bw, Lib::Mpich, 1), None);
        assert_eq!(s.iter().count(), 3);
    }
}
