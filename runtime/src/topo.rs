//! Cartesian process topologies: [`dims_create`], [`Comm::cart_create`] and [`CartComm`] with
//! coordinates, shifts, sub-grids and the neighbour collectives.
//!
//! Ranks are laid out in row-major order (the last dimension varies fastest), as in MPI. The
//! grid keeps the ranks of the communicator it was made from (`reorder` is accepted and
//! ignored: within one shared-memory node no placement is better than another).
//!
//! A rank's neighbours, in the order the neighbour collectives use, are for each dimension `d`
//! the rank at `-1` then the rank at `+1` along `d` (`MPI_Cart_shift(d, 1)`'s source, then its
//! destination). At the edge of a non-periodic dimension there is no neighbour (MPI's
//! `MPI_PROC_NULL`): nothing is sent there and the matching receive block is left unchanged.

use std::ops::Deref;

use bytemuck::Pod;

use crate::coll::CollP2p;
use crate::coll_ctx::CollCtx;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::seen::{self, Kind, What};
use crate::Rank;

/// Tags of the neighbour collectives (on the collective context, apart from [`crate::coll::tags`]).
const TAG_NEIGHBOR_ALLGATHER: u32 = 40;
const TAG_NEIGHBOR_ALLTOALL: u32 = 41;

/// Fills the zero entries of `dims` so that the product of all entries is `n`, as evenly as
/// possible, the filled entries in non-increasing order (`MPI_Dims_create`). Non-zero entries
/// are kept.
///
/// ```
/// let mut d = [0, 0];
/// tmpi::dims_create(12, &mut d).unwrap();
/// assert_eq!(d, [4, 3]);
/// let mut d = [0, 3, 0];
/// tmpi::dims_create(30, &mut d).unwrap();
/// assert_eq!(d, [5, 3, 2]);
/// ```
///
/// # Errors
/// [`Error::InvalidTopology`] when `n` is 0 (or above `u32::MAX`) or the product of the non-zero entries does not
/// divide `n` (or, with no zero entry, differs from `n`).
pub fn dims_create(n: usize, dims: &mut [usize]) -> Result<()> {
    if n == 0 || n > u32::MAX as usize {
        return Err(Error::InvalidTopology(format!("dims_create: {n} ranks (1..=2^32-1 accepted)")));
    }
    let fixed = dims.iter().filter(|&&d| d != 0).try_fold(1usize, |a, &d| a.checked_mul(d));
    let free = dims.iter().filter(|&&d| d == 0).count();
    let fixed = match fixed {
        Some(f) if n % f == 0 && (free > 0 || f == n) => f,
        _ => return Err(Error::InvalidTopology(format!("dims_create: the given dimensions {dims:?} do not divide {n} ranks"))),
    };
    if free == 0 {
        return Ok(());
    }
    // Prime factors of what is left, largest first, each to the currently smallest dimension.
    let mut m = n / fixed;
    let mut primes = Vec::new();
    let mut f = 2;
    while f * f <= m {
        while m % f == 0 {
            primes.push(f);
            m /= f;
        }
        f += 1;
    }
    if m > 1 {
        primes.push(m);
    }
    let mut out = vec![1usize; free];
    for p in primes.into_iter().rev() {
        if let Some(small) = out.iter_mut().min() {
            *small *= p;
        }
    }
    out.sort_unstable_by(|a, b| b.cmp(a));
    let mut it = out.into_iter();
    for d in dims.iter_mut().filter(|d| **d == 0) {
        *d = it.next().unwrap_or(1);
    }
    Ok(())
}

/// A communicator with a Cartesian grid topology ([`Comm::cart_create`]). Derefs to [`Comm`],
/// so every communicator call works on it too.
#[derive(Clone, Debug)]
pub struct CartComm {
    comm: Comm,
    dims: Vec<usize>,
    periods: Vec<bool>,
}

impl Deref for CartComm {
    type Target = Comm;
    fn deref(&self) -> &Comm {
        &self.comm
    }
}

impl Comm {
    /// Arranges the first `dims.iter().product()` ranks in a grid of `dims`, periodic along the
    /// dimensions where `periods` is true (collective). Ranks beyond the grid get `None`.
    /// `reorder` is accepted for MPI compatibility; ranks are kept.
    ///
    /// ```
    /// let coords = tmpi::run_local(6, |w| {
    ///     let cart = w.cart_create(&[2, 3], &[false, true], false).unwrap().unwrap();
    ///     let (left, right) = cart.shift(1, 1).unwrap();
    ///     (cart.coords(), left, right)
    /// });
    /// assert_eq!(coords[4], (vec![1, 1], Some(3), Some(5)));
    /// assert_eq!(coords[5], (vec![1, 2], Some(4), Some(3))); // periodic: wraps
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidTopology`] (before any communication) when `dims` and `periods` differ in
    /// length, a dimension is 0, or the grid has more cells than the communicator has ranks; as
    /// [`Comm::split`].
    pub fn cart_create(&self, dims: &[usize], periods: &[bool], reorder: bool) -> Result<Option<CartComm>> {
        if seen::on() {
            return seen::call(What::new(Kind::CartCreate).on(self), || self.cart_create(dims, periods, reorder));
        }
        let _ = reorder;
        if dims.len() != periods.len() {
            return Err(Error::InvalidTopology(format!("cart_create: {} dimensions but {} periodicity flags", dims.len(), periods.len())));
        }
        let cells = dims.iter().try_fold(1usize, |a, &d| if d == 0 { None } else { a.checked_mul(d) });
        let cells = match cells {
            Some(c) if c <= self.size() => c,
            _ => {
                return Err(Error::InvalidTopology(format!(
                    "cart_create: grid {dims:?} does not fit a communicator of {} ranks",
                    self.size()
                )))
            }
        };
        let inside = self.rank() < cells;
        let key = i32::try_from(self.rank()).unwrap_or(i32::MAX);
        let comm = self.split(inside.then_some(0), key)?;
        Ok(comm.map(|comm| CartComm { comm, dims: dims.to_vec(), periods: periods.to_vec() }))
    }
}

impl crate::seen::Seen for CartComm {}

impl CartComm {
    /// The communicator underneath.
    pub fn comm(&self) -> &Comm {
        &self.comm
    }

    /// Number of dimensions.
    pub fn ndims(&self) -> usize {
        self.dims.len()
    }

    /// Extent of each dimension.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Whether each dimension is periodic.
    pub fn periods(&self) -> &[bool] {
        &self.periods
    }

    /// This rank's coordinates.
    pub fn coords(&self) -> Vec<usize> {
        self.coords_of_unchecked(self.rank())
    }

    fn coords_of_unchecked(&self, mut rank: Rank) -> Vec<usize> {
        let mut c = vec![0; self.dims.len()];
        for (d, &n) in self.dims.iter().enumerate().rev() {
            c[d] = rank % n;
            rank /= n;
        }
        c
    }

    /// The coordinates of `rank` (`MPI_Cart_coords`).
    ///
    /// # Errors
    /// [`Error::InvalidRank`].
    pub fn coords_of(&self, rank: Rank) -> Result<Vec<usize>> {
        self.check_rank(rank)?;
        Ok(self.coords_of_unchecked(rank))
    }

    /// The rank at `coords` (`MPI_Cart_rank`). Along periodic dimensions any coordinate is
    /// taken modulo the extent (negative ones too).
    ///
    /// # Errors
    /// [`Error::InvalidTopology`] when `coords` has the wrong length or a coordinate is outside
    /// a non-periodic dimension.
    pub fn cart_rank(&self, coords: &[isize]) -> Result<Rank> {
        if coords.len() != self.dims.len() {
            return Err(Error::InvalidTopology(format!("cart_rank: {} coordinates for {} dimensions", coords.len(), self.dims.len())));
        }
        let mut rank = 0usize;
        for (d, &c) in coords.iter().enumerate() {
            let c = self.wrap(d, c).ok_or_else(|| {
                Error::InvalidTopology(format!("cart_rank: coordinate {c} is outside dimension {d} of extent {}", self.dims[d]))
            })?;
            rank = rank * self.dims[d] + c;
        }
        Ok(rank)
    }

    /// Coordinate `c` along dimension `d`, wrapped if periodic; `None` if off the grid.
    fn wrap(&self, d: usize, c: isize) -> Option<usize> {
        let n = self.dims[d] as isize;
        if self.periods[d] {
            Some(c.rem_euclid(n) as usize)
        } else if (0..n).contains(&c) {
            Some(c as usize)
        } else {
            None
        }
    }

    /// The ranks `disp` steps back and forward along dimension `dim` (`MPI_Cart_shift`): the
    /// source to receive from and the destination to send to in a shift by `disp`. `None` past
    /// the edge of a non-periodic dimension (`MPI_PROC_NULL`).
    ///
    /// # Errors
    /// [`Error::InvalidTopology`] when `dim` is not a dimension.
    pub fn shift(&self, dim: usize, disp: isize) -> Result<(Option<Rank>, Option<Rank>)> {
        if dim >= self.dims.len() {
            return Err(Error::InvalidTopology(format!("shift: dimension {dim} of {}", self.dims.len())));
        }
        let me: Vec<isize> = self.coords().into_iter().map(|c| c as isize).collect();
        let at = |delta: isize| -> Option<Rank> {
            let mut c = me.clone();
            c[dim] = c[dim].checked_add(delta)?;
            self.wrap(dim, c[dim])?;
            self.cart_rank(&c).ok()
        };
        let back = disp.checked_neg().ok_or_else(|| Error::InvalidTopology(format!("shift: displacement {disp} cannot be negated")))?;
        Ok((at(back), at(disp)))
    }

    /// The sub-grids that keep the dimensions where `remain` is true (collective,
    /// `MPI_Cart_sub`): ranks that agree on the dropped coordinates form one sub-grid.
    ///
    /// ```
    /// let rows = tmpi::run_local(6, |w| {
    ///     let cart = w.cart_create(&[2, 3], &[false, false], false).unwrap().unwrap();
    ///     let row = cart.sub(&[false, true]).unwrap();
    ///     (row.dims().to_vec(), row.rank())
    /// });
    /// assert_eq!(rows[4], (vec![3], 1));
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidTopology`] when `remain` has the wrong length; as [`Comm::split`].
    pub fn sub(&self, remain: &[bool]) -> Result<CartComm> {
        if seen::on() {
            return seen::call(What::new(Kind::CartSub).on(&self.comm), || self.sub(remain));
        }
        if remain.len() != self.dims.len() {
            return Err(Error::InvalidTopology(format!("sub: {} flags for {} dimensions", remain.len(), self.dims.len())));
        }
        let c = self.coords();
        let (mut color, mut key) = (0usize, 0usize);
        for d in 0..self.dims.len() {
            if remain[d] {
                key = key * self.dims[d] + c[d];
            } else {
                color = color * self.dims[d] + c[d];
            }
        }
        let color = u32::try_from(color).map_err(|_| Error::InvalidTopology("sub: too many sub-grids".into()))?;
        let key = i32::try_from(key).map_err(|_| Error::InvalidTopology("sub: sub-grid too large".into()))?;
        let comm = self.comm.split(Some(color), key)?.ok_or_else(|| Error::State("cart sub: split lost this rank".into()))?;
        let keep = |v: &[usize]| (0..self.dims.len()).filter(|&d| remain[d]).map(|d| v[d]).collect::<Vec<_>>();
        let periods = (0..self.dims.len()).filter(|&d| remain[d]).map(|d| self.periods[d]).collect();
        Ok(CartComm { comm, dims: keep(&self.dims), periods })
    }

    /// This rank's neighbours in neighbour-collective order: for each dimension, the rank at
    /// `-1` then the rank at `+1` (`None` past a non-periodic edge).
    pub fn neighbors(&self) -> Vec<Option<Rank>> {
        (0..self.dims.len()).flat_map(|d| self.shift(d, 1).map(|(s, t)| [s, t]).unwrap_or([None, None])).collect()
    }

    /// Sends `send` to every neighbour and receives each neighbour's block into `recv`
    /// (`2 * ndims` blocks of `send.len()`, in [`CartComm::neighbors`] order); blocks of absent
    /// neighbours are left unchanged (collective).
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let ring = w.cart_create(&[3], &[true], false).unwrap().unwrap();
    ///     let mut nb = [0u32; 2];
    ///     ring.neighbor_allgather(&[10 * ring.rank() as u32], &mut nb).unwrap();
    ///     nb
    /// });
    /// assert_eq!(got, vec![[20, 10], [0, 20], [10, 0]]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when `recv.len() != 2 * ndims * send.len()`, or a neighbour's
    /// block has another length; [`Error::PeerGone`].
    pub fn neighbor_allgather<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::NeighborAllgather).on(&self.comm).bytes(size_of_val(send)), || {
                self.neighbor_allgather(send, recv)
            });
        }
        let k = self.dims.len() * 2;
        if Some(recv.len()) != send.len().checked_mul(k) {
            return Err(Error::InvalidBuffer(format!(
                "neighbor_allgather: receive buffer has {} elements, {k} neighbours * {} needed",
                recv.len(),
                send.len()
            )));
        }
        let b = send.len();
        let c = CollCtx::new(&self.comm)?;
        c.finish(self.exchange(&c, TAG_NEIGHBOR_ALLGATHER, |_| bytemuck::cast_slice(send), recv, b))
    }

    /// Sends block `i` of `send` to neighbour `i` and receives neighbour `i`'s block into block
    /// `i` of `recv` (`2 * ndims` equal blocks each, [`CartComm::neighbors`] order); blocks of
    /// absent neighbours are not sent, or left unchanged (collective).
    ///
    /// ```
    /// let got = tmpi::run_local(2, |w| {
    ///     let line = w.cart_create(&[2], &[false], false).unwrap().unwrap();
    ///     let r = line.rank() as u8;
    ///     let mut nb = [9u8; 2];
    ///     line.neighbor_alltoall(&[r * 10, r * 10 + 1], &mut nb).unwrap();
    ///     nb
    /// });
    /// assert_eq!(got, vec![[9, 10], [1, 9]]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when the lengths are not `2 * ndims` equal blocks, or a
    /// neighbour's block has another length; [`Error::PeerGone`].
    pub fn neighbor_alltoall<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::NeighborAlltoall).on(&self.comm).bytes(size_of_val(send)), || {
                self.neighbor_alltoall(send, recv)
            });
        }
        let k = self.dims.len() * 2;
        if send.len() != recv.len() || (k == 0 && !send.is_empty()) || (k > 0 && send.len() % k != 0) {
            return Err(Error::InvalidBuffer(format!(
                "neighbor_alltoall: send has {} elements and receive {}; both must be the same multiple of {k} neighbours",
                send.len(),
                recv.len()
            )));
        }
        let b = send.len().checked_div(k).unwrap_or(0);
        let c = CollCtx::new(&self.comm)?;
        c.finish(self.exchange(&c, TAG_NEIGHBOR_ALLTOALL, |i| bytemuck::cast_slice(&send[i * b..(i + 1) * b]), recv, b))
    }

    /// For each dimension: send block `block(2d + 1)` to the `+1` neighbour while receiving
    /// block `2d` from the `-1` neighbour, then block `block(2d)` to `-1` while receiving block
    /// `2d + 1` from `+1`. In each step every rank sends to the rank that receives from it, so
    /// no step waits on another.
    fn exchange<'b, T: Pod>(&self, c: &CollCtx<'_>, tag: u32, block: impl Fn(usize) -> &'b [u8], recv: &mut [T], b: usize) -> Result<()> {
        let nbs = self.neighbors();
        for d in 0..self.dims.len() {
            for (to_i, from_i) in [(2 * d + 1, 2 * d), (2 * d, 2 * d + 1)] {
                let rbuf: &mut [u8] = bytemuck::cast_slice_mut(&mut recv[from_i * b..(from_i + 1) * b]);
                let want = rbuf.len();
                let got = match (nbs[to_i], nbs[from_i]) {
                    (Some(to), Some(from)) => Some((c.sendrecv(block(to_i), to, tag, rbuf, from, tag)?, from)),
                    (Some(to), None) => {
                        c.send(block(to_i), to, tag)?;
                        None
                    }
                    (None, Some(from)) => Some((c.recv(rbuf, from, tag)?, from)),
                    (None, None) => None,
                };
                if let Some((n, from)) = got {
                    if n != want {
                        return Err(Error::InvalidBuffer(format!(
                            "neighbour collective: {n} bytes from rank {from} where {want} were expected"
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_local;

    #[test]
    fn dims_create_balances() {
        let cases: [(usize, Vec<usize>, Vec<usize>); 8] = [
            (1, vec![0, 0], vec![1, 1]),
            (7, vec![0, 0], vec![7, 1]),
            (12, vec![0, 0, 0], vec![3, 2, 2]),
            (16, vec![0, 0], vec![4, 4]),
            (24, vec![0, 2, 0], vec![4, 2, 3]),
            (36, vec![0, 0], vec![6, 6]),
            (6, vec![2, 3], vec![2, 3]),
            (0x10000, vec![0, 0], vec![256, 256]),
        ];
        for (n, mut d, want) in cases {
            dims_create(n, &mut d).unwrap();
            assert_eq!(d, want, "{n}");
            assert_eq!(d.iter().product::<usize>(), n);
        }
        assert!(matches!(dims_create(0, &mut [0]), Err(Error::InvalidTopology(_))));
        assert!(matches!(dims_create(10, &mut [3, 0]), Err(Error::InvalidTopology(_))));
        assert!(matches!(dims_create(10, &mut [2, 3]), Err(Error::InvalidTopology(_))));
        assert!(matches!(dims_create(10, &mut [usize::MAX, 2, 0]), Err(Error::InvalidTopology(_))));
        assert!(matches!(dims_create(5, &mut []), Err(Error::InvalidTopology(_))));
        dims_create(1, &mut []).unwrap();
        assert!(matches!(dims_create(usize::MAX, &mut [0]), Err(Error::InvalidTopology(_))));
    }

    #[test]
    fn grids_coords_shifts_and_subs() {
        for n in 1..=7 {
            run_local(n, |w| {
                let mut dims = [0, 0];
                dims_create(n, &mut dims).unwrap();
                for periods in [[false, false], [true, false], [true, true]] {
                    let cart = w.cart_create(&dims, &periods, true).unwrap().unwrap();
                    coords_and_shifts(&cart, dims, periods);
                    neighbor_collectives(&cart, n, periods);
                    subgrids(&cart, w.rank(), dims, periods);
                }
                partial_and_refused_grids(&w, n);
            });
        }
    }

    /// Coordinates and ranks agree both ways; a shift of 1 along each dimension names the
    /// neighbours, none past a non-periodic edge.
    fn coords_and_shifts(cart: &CartComm, dims: [usize; 2], periods: [bool; 2]) {
        let c = cart.coords();
        assert_eq!(cart.cart_rank(&[c[0] as isize, c[1] as isize]).unwrap(), cart.rank());
        assert_eq!(cart.coords_of(cart.rank()).unwrap(), c);
        for d in 0..2 {
            let (src, dst) = cart.shift(d, 1).unwrap();
            let step = |delta: isize| {
                let mut x = [c[0] as isize, c[1] as isize];
                x[d] += delta;
                cart.cart_rank(&x).ok()
            };
            assert_eq!((src, dst), (step(-1), step(1)));
            assert_eq!(src.is_none(), !periods[d] && c[d] == 0);
            assert_eq!(dst.is_none(), !periods[d] && c[d] == dims[d] - 1);
        }
    }

    /// Neighbour allgather of ranks gives the neighbour list; in the neighbour alltoall,
    /// block i to neighbour i says (my rank, i), and I get from neighbour i the block it sent
    /// in the opposite direction.
    fn neighbor_collectives(cart: &CartComm, n: usize, periods: [bool; 2]) {
        let mut nb = vec![usize::MAX; 4];
        cart.neighbor_allgather(&[cart.rank()], &mut nb).unwrap();
        let want: Vec<usize> = cart.neighbors().iter().map(|x| x.unwrap_or(usize::MAX)).collect();
        assert_eq!(nb, want);
        let send: Vec<[usize; 2]> = (0..4).map(|i| [cart.rank(), i]).collect();
        let mut got = vec![[usize::MAX; 2]; 4];
        cart.neighbor_alltoall(&send, &mut got).unwrap();
        for (i, nbr) in cart.neighbors().iter().enumerate() {
            assert_eq!(got[i], nbr.map(|r| [r, i ^ 1]).unwrap_or([usize::MAX; 2]), "n={n} {periods:?} i={i}");
        }
    }

    /// Rows, columns and the empty subgrid; a row's allreduce sums its world ranks.
    fn subgrids(cart: &CartComm, world_rank: usize, dims: [usize; 2], periods: [bool; 2]) {
        let c = cart.coords();
        let row = cart.sub(&[false, true]).unwrap();
        assert_eq!((row.dims(), row.rank()), (&dims[1..], c[1]));
        let col = cart.sub(&[true, false]).unwrap();
        assert_eq!((col.dims(), col.rank(), col.periods()), (&dims[..1], c[0], &periods[..1]));
        let none = cart.sub(&[false, false]).unwrap();
        assert_eq!(none.size(), 1);
        let mut s = [0usize];
        row.allreduce(&[world_rank], &mut s, crate::Op::Sum).unwrap();
        let base = c[0] * dims[1];
        assert_eq!(s[0], (base..base + dims[1]).sum::<usize>());
    }

    /// A smaller grid leaves ranks out; bad grids and coordinates are errors before anything
    /// is communicated; a ring wraps around.
    fn partial_and_refused_grids(w: &crate::Comm, n: usize) {
        let part = w.cart_create(&[n.div_ceil(2)], &[false], false).unwrap();
        assert_eq!(part.is_some(), w.rank() < n.div_ceil(2));
        assert!(matches!(w.cart_create(&[n + 1], &[false], false), Err(Error::InvalidTopology(_))));
        assert!(matches!(w.cart_create(&[n, 0], &[false, false], false), Err(Error::InvalidTopology(_))));
        assert!(matches!(w.cart_create(&[n], &[], false), Err(Error::InvalidTopology(_))));
        let line = w.cart_create(&[n], &[false], false).unwrap().unwrap();
        assert!(matches!(line.cart_rank(&[n as isize]), Err(Error::InvalidTopology(_))));
        assert!(matches!(line.cart_rank(&[-1]), Err(Error::InvalidTopology(_))));
        assert!(matches!(line.shift(1, 1), Err(Error::InvalidTopology(_))));
        assert!(matches!(line.neighbor_allgather(&[1u8], &mut [0u8; 3]), Err(Error::InvalidBuffer(_))));
        assert!(matches!(line.neighbor_alltoall(&[1u8; 3], &mut [0u8; 3]), Err(Error::InvalidBuffer(_))));
        let ring = w.cart_create(&[n], &[true], false).unwrap().unwrap();
        assert_eq!(ring.cart_rank(&[-1]).unwrap(), n - 1);
        assert_eq!(ring.shift(0, n as isize + 1).unwrap(), (Some((w.rank() + n - 1) % n), Some((w.rank() + 1) % n)));
    }
}
