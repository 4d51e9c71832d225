//! Type maps: what the bytes of an element type are, for element types beyond `Pod` (structs
//! with padding, `bool`, nested structs, arrays and tuples).
//!
//! A [`TypeMap`] lists the byte runs of one element that carry data, in the order they are
//! packed on the wire, the element's extent (bytes from one element to the next), and where the
//! `bool` bytes sit in the packed element. [`TypeMapBuilder`] builds one from the maps of the
//! parts; `#[derive(tmpi::Element)]` uses it to build a struct's map once, on first use, and
//! tmpi-rsmpi builds its datatypes (`UserDatatype`, `#[derive(Equivalence)]`) with it too.
//!
//! An [`Element`] names its type map. A type whose map is one run covering the whole element
//! (no padding) and has no `bool` is sent and received in place, with no copy; any other is
//! packed into a dense byte stream on the way out and unpacked on the way in, where every `bool`
//! byte is checked first (a byte that is neither 0 nor 1 is [`Error::InvalidValue`], not an
//! invalid `bool`). The calls that take such elements are in [`crate::typed`].

use std::borrow::Cow;

use crate::error::{Error, Result};
use crate::Rank;

/// The layout of one element: its data runs in packed order, extent and `bool` positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeMap {
    /// Data bytes in one element (the packed size).
    size: usize,
    /// Lower bound, in bytes from the element's address.
    lb: isize,
    /// Upper bound; the extent is `ub - lb`.
    ub: isize,
    /// Byte runs `(offset, len)` in packed order, adjacent runs merged.
    runs: Cow<'static, [(isize, usize)]>,
    /// Positions of `bool` bytes in the packed element.
    bools: Cow<'static, [usize]>,
    /// Largest alignment among the parts.
    align: usize,
}

impl TypeMap {
    /// The map of a primitive of `size` bytes (1, 2, 4, 8 or 16) and alignment `align`, all
    /// data; a `bool` when `boolean` (then `size` is 1). Usable in a `static`.
    ///
    /// # Panics
    /// When `size` is not one of those sizes (at compile time in a `static`).
    pub const fn primitive(size: usize, align: usize, boolean: bool) -> TypeMap {
        let runs: &'static [(isize, usize)] = match size {
            1 => &[(0, 1)],
            2 => &[(0, 2)],
            4 => &[(0, 4)],
            8 => &[(0, 8)],
            16 => &[(0, 16)],
            _ => panic!("TypeMap::primitive: size must be 1, 2, 4, 8 or 16"),
        };
        let bools: &'static [usize] = if boolean { &[0] } else { &[] };
        TypeMap { size, lb: 0, ub: size as isize, runs: Cow::Borrowed(runs), bools: Cow::Borrowed(bools), align }
    }

    /// The map of a `Pod` type: all of its bytes are data, every bit pattern is valid.
    pub fn pod<F: bytemuck::Pod>() -> TypeMap {
        let size = std::mem::size_of::<F>();
        let runs = if size == 0 { Vec::new() } else { vec![(0, size)] };
        TypeMap { size, lb: 0, ub: size as isize, runs: Cow::Owned(runs), bools: Cow::Borrowed(&[]), align: std::mem::align_of::<F>() }
    }

    /// Data bytes in one element (its packed size).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Lower bound in bytes (0 for a Rust type).
    pub fn lb(&self) -> isize {
        self.lb
    }

    /// Upper bound in bytes.
    pub fn ub(&self) -> isize {
        self.ub
    }

    /// Bytes from one element to the next.
    pub fn extent(&self) -> isize {
        self.ub - self.lb
    }

    /// The data runs `(offset, len)` in packed order.
    pub fn runs(&self) -> &[(isize, usize)] {
        &self.runs
    }

    /// Positions of the `bool` bytes in the packed element.
    pub fn bools(&self) -> &[usize] {
        &self.bools
    }

    /// Largest alignment among the parts.
    pub fn align(&self) -> usize {
        self.align
    }

    /// Whether `n` elements are exactly `n * size` bytes of data with no gaps, in packed
    /// order: then they are sent as they lie in memory.
    pub fn is_dense(&self) -> bool {
        self.lb == 0 && self.ub == self.size as isize && (self.size == 0 || self.runs.as_ref() == [(0, self.size)])
    }

    /// Whether received bytes may be written straight into user memory (dense, no `bool`).
    pub fn direct_recv(&self) -> bool {
        self.is_dense() && self.bools.is_empty()
    }

    /// Checks every `bool` byte of the packed elements in `packed` (whole elements and a
    /// trailing part alike).
    ///
    /// # Errors
    /// [`Error::InvalidValue`] naming the first byte that is neither 0 nor 1 (`source_rank` is
    /// the rank the bytes came from, for the message).
    pub fn check_bools(&self, packed: &[u8], source_rank: Rank) -> Result<()> {
        if self.bools.is_empty() || self.size == 0 {
            return Ok(());
        }
        for (i, el) in packed.chunks(self.size).enumerate() {
            for &b in self.bools.iter() {
                if let Some(&byte) = el.get(b).filter(|&&v| v > 1) {
                    return Err(Error::InvalidValue { source_rank, offset: i * self.size + b, byte });
                }
            }
        }
        Ok(())
    }

    /// Copies the data of `count` elements at `base` into `out`, in packed order.
    ///
    /// # Safety
    /// `base` must point at `count` elements this map describes, valid for reads of every run,
    /// and `out` must hold at least `count * size()` bytes.
    pub unsafe fn pack_into(&self, base: *const u8, count: usize, out: &mut [u8]) {
        assert!(out.len() >= count.saturating_mul(self.size), "TypeMap::pack_into: output too short");
        let mut pos = 0;
        for i in 0..count {
            let el = base.wrapping_offset(i as isize * self.extent());
            for &(off, len) in self.runs.iter() {
                // SAFETY: the caller promises every run of every element is readable; `out`
                // holds `count * size` bytes (asserted), the sum of the runs' lengths.
                unsafe { std::ptr::copy_nonoverlapping(el.wrapping_offset(off), out.as_mut_ptr().add(pos), len) };
                pos += len;
            }
        }
    }

    /// Writes the first `count` packed elements of `packed` into the elements at `base`; the
    /// bytes between runs (padding) are left alone.
    ///
    /// # Safety
    /// `base` must point at `count` elements this map describes, valid for writes of every
    /// run; `packed` must hold at least `count * size()` bytes whose `bool` positions hold 0 or
    /// 1 ([`TypeMap::check_bools`]).
    pub unsafe fn unpack_from(&self, packed: &[u8], base: *mut u8, count: usize) {
        assert!(packed.len() >= count.saturating_mul(self.size), "TypeMap::unpack_from: input too short");
        let mut pos = 0;
        for i in 0..count {
            let el = base.wrapping_offset(i as isize * self.extent());
            for &(off, len) in self.runs.iter() {
                // SAFETY: the caller promises the runs of the `count` elements are writable;
                // `packed` holds `count * size` bytes (asserted).
                unsafe { std::ptr::copy_nonoverlapping(packed.as_ptr().add(pos), el.wrapping_offset(off), len) };
                pos += len;
            }
        }
    }
}

/// Builds a [`TypeMap`] from copies of other maps placed at byte displacements.
#[derive(Debug, Clone, Default)]
pub struct TypeMapBuilder {
    runs: Vec<(isize, usize)>,
    bools: Vec<usize>,
    size: usize,
    lb: Option<isize>,
    ub: Option<isize>,
    align: usize,
}

impl TypeMapBuilder {
    /// An empty map.
    pub fn new() -> TypeMapBuilder {
        TypeMapBuilder { align: 1, ..TypeMapBuilder::default() }
    }

    /// Appends `copies` copies of `part`, the first at byte `disp`, each `part`'s extent apart.
    pub fn place(&mut self, part: &TypeMap, disp: isize, copies: usize) -> &mut TypeMapBuilder {
        let ext = part.extent();
        for k in 0..copies {
            let at = disp + k as isize * ext;
            self.bools.extend(part.bools.iter().map(|&b| self.size + b));
            for &(off, len) in part.runs.iter() {
                self.push_run(at + off, len);
            }
            self.lb = Some(self.lb.map_or(at + part.lb, |l| l.min(at + part.lb)));
            self.ub = Some(self.ub.map_or(at + part.ub, |u| u.max(at + part.ub)));
            self.size += part.size;
        }
        if copies > 0 {
            self.align = self.align.max(part.align);
        }
        self
    }

    fn push_run(&mut self, off: isize, len: usize) {
        if len == 0 {
            return;
        }
        if let Some(last) = self.runs.last_mut() {
            if last.0 + last.1 as isize == off {
                last.1 += len;
                return;
            }
        }
        self.runs.push((off, len));
    }

    /// The map, with the bounds of what was placed; when `round_to_align`, the extent is
    /// rounded up to the largest alignment (as C rounds a struct's size).
    pub fn finish(self, round_to_align: bool) -> TypeMap {
        let lb = self.lb.unwrap_or(0);
        let mut ub = self.ub.unwrap_or(0);
        if round_to_align && self.align > 1 {
            let a = self.align as isize;
            ub = lb + (ub - lb + a - 1) / a * a;
        }
        self.into_map(lb, ub)
    }

    /// The map of a Rust type of `size` bytes: bounds `0..size`.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when a placed run or bool lies outside `0..size`, or two runs
    /// overlap (then the parts do not describe one value of the type).
    pub fn finish_sized(mut self, size: usize) -> Result<TypeMap> {
        let mut sorted = self.runs.clone();
        sorted.sort_unstable();
        let inside = sorted.iter().all(|&(off, len)| off >= 0 && (off as usize).checked_add(len).is_some_and(|e| e <= size));
        let disjoint = sorted.windows(2).all(|w| w[0].0 + w[0].1 as isize <= w[1].0);
        if !inside || !disjoint {
            return Err(Error::InvalidBuffer(format!("type map runs {:?} do not describe a value of {size} bytes", self.runs)));
        }
        self.align = self.align.max(1);
        Ok(self.into_map(0, size as isize))
    }

    fn into_map(self, lb: isize, ub: isize) -> TypeMap {
        TypeMap { size: self.size, lb, ub, runs: Cow::Owned(self.runs), bools: Cow::Owned(self.bools), align: self.align }
    }
}

/// An element type that tmpi can send and receive: it names its [`TypeMap`].
///
/// Implemented for the primitive integers, floats and `bool`, and by
/// `#[derive(tmpi::Element)]` for structs whose fields are all `Element` (or `Pod`, marked
/// `#[tmpi(pod)]`), arrays and tuples of such. A tuple as a whole element goes through a tuple
/// struct (`#[derive(Element)] struct Pair(u8, f64);`).
///
/// # Safety
/// `type_map()` must describe `Self`: bounds `0..size_of::<Self>()`; every run lies inside and
/// holds initialized bytes in every value of `Self` (no padding byte is in a run); writing into
/// the runs of a valid `Self` any bytes whose `bool` positions hold 0 or 1 leaves a valid
/// `Self`. `Self` has no interior mutability.
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The type's map (built once).
    fn type_map() -> &'static TypeMap;
}

macro_rules! element_prim {
    ($($t:ty => $name:ident, $bool:expr;)*) => {$(
        static $name: TypeMap = TypeMap::primitive(std::mem::size_of::<$t>(), std::mem::align_of::<$t>(), $bool);
        // SAFETY: the map is one run over the whole value; every bit pattern is a valid value,
        // except for `bool`, whose byte is listed as a bool.
        unsafe impl Element for $t {
            fn type_map() -> &'static TypeMap {
                &$name
            }
        }
    )*};
}
element_prim! {
    bool => BOOL, true;
    u8 => U8, false;
    i8 => I8, false;
    u16 => U16, false;
    i16 => I16, false;
    u32 => U32, false;
    i32 => I32, false;
    u64 => U64, false;
    i64 => I64, false;
    u128 => U128, false;
    i128 => I128, false;
    usize => USIZE, false;
    isize => ISIZE, false;
    f32 => F32, false;
    f64 => F64, false;
}

/// Used by `#[derive(tmpi::Element)]`.
#[doc(hidden)]
pub mod internal {
    use super::{TypeMap, TypeMapBuilder};

    /// The map of `[part; n]`.
    pub fn array(part: &TypeMap, n: usize) -> TypeMap {
        let mut b = TypeMapBuilder::new();
        b.place(part, 0, n);
        b.finish(false)
    }

    /// A finished derived map; panics (naming the type) if the parts do not describe it, which
    /// only a wrong hand-written `Element` of a field can cause.
    pub fn finish(b: TypeMapBuilder, size: usize, ty: &str) -> TypeMap {
        b.finish_sized(size).unwrap_or_else(|e| panic!("#[derive(Element)] for {ty}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Shape = (usize, isize, Vec<(isize, usize)>, Vec<usize>, bool, bool);

    fn shape(m: &TypeMap) -> Shape {
        (m.size(), m.extent(), m.runs().to_vec(), m.bools().to_vec(), m.is_dense(), m.direct_recv())
    }

    /// Maps built from parts: size, extent, runs (merged when adjacent), bool positions in the
    /// packed element, whether dense and whether received in place.
    #[test]
    fn maps_from_parts() {
        let place = |parts: &[(&TypeMap, isize, usize)], size: usize| {
            let mut b = TypeMapBuilder::new();
            for &(m, d, n) in parts {
                b.place(m, d, n);
            }
            b.finish_sized(size).unwrap()
        };
        let cases: Vec<(&str, TypeMap, Shape)> = vec![
            ("u32", u32::type_map().clone(), (4, 4, vec![(0, 4)], vec![], true, true)),
            ("bool", bool::type_map().clone(), (1, 1, vec![(0, 1)], vec![0], true, false)),
            ("{u8@0, u32@4} (padding)", place(&[(&U8, 0, 1), (&U32, 4, 1)], 8), (5, 8, vec![(0, 1), (4, 4)], vec![], false, false)),
            ("{u32@0, u32@4} (dense)", place(&[(&U32, 0, 1), (&U32, 4, 1)], 8), (8, 8, vec![(0, 8)], vec![], true, true)),
            ("{u32@4, u32@0} (reordered)", place(&[(&U32, 4, 1), (&U32, 0, 1)], 8), (8, 8, vec![(4, 4), (0, 4)], vec![], false, false)),
            (
                "{f64@0, [bool; 3]@8}",
                place(&[(&F64, 0, 1), (&internal::array(&BOOL, 3), 8, 1)], 16),
                (11, 16, vec![(0, 11)], vec![8, 9, 10], false, false),
            ),
            ("[u16; 0]", internal::array(&U16, 0), (0, 0, vec![], vec![], true, true)),
        ];
        for (what, m, want) in cases {
            assert_eq!(shape(&m), want, "{what}");
        }
        let mut b = TypeMapBuilder::new();
        b.place(&U32, 2, 1);
        assert!(b.clone().finish_sized(4).is_err(), "a run past the end");
        b.place(&U32, 4, 1);
        assert!(b.finish_sized(8).is_err(), "overlapping runs");
        assert_eq!(TypeMap::pod::<[u16; 3]>().runs(), &[(0, 6)]);
    }

    /// Pack then unpack moves the runs and leaves padding alone; a bad bool is found.
    #[test]
    fn pack_unpack_and_bools() {
        let mut b = TypeMapBuilder::new();
        b.place(&BOOL, 0, 1).place(&U16, 2, 1);
        let m = b.finish_sized(4).unwrap();
        let src: [u8; 8] = [1, 0xEE, 7, 0, 0, 0xEE, 9, 1];
        let mut packed = [0u8; 6];
        // SAFETY: two 4-byte elements lie in `src`; `packed` has 2 * 3 bytes.
        unsafe { m.pack_into(src.as_ptr(), 2, &mut packed) };
        assert_eq!(packed, [1, 7, 0, 0, 9, 1]);
        m.check_bools(&packed, 0).unwrap();
        let mut dst = [0x55u8; 8];
        // SAFETY: as above, for writes; the bools were checked.
        unsafe { m.unpack_from(&packed, dst.as_mut_ptr(), 2) };
        assert_eq!(dst, [1, 0x55, 7, 0, 0, 0x55, 9, 1]);
        let e = m.check_bools(&[1, 0, 0, 2, 0, 0], 3).unwrap_err();
        assert!(matches!(e, Error::InvalidValue { source_rank: 3, offset: 3, byte: 2 }), "{e:?}");
    }
}
