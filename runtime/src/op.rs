//! Reduction operators ([`Op`]) and the element types they apply to ([`Reducible`]).
//!
//! Semantics follow C MPI's predefined operators:
//!
//! | op | integers | floats |
//! |----|----------|--------|
//! | `Sum`, `Prod` | wrapping (two's complement, as C MPI on every real machine) | IEEE 754 |
//! | `Min`, `Max` | ordinary order | see below |
//! | `BitAnd`, `BitOr`, `BitXor` | bitwise | [`Error::InvalidOp`] |
//! | `LogicalAnd`, `LogicalOr` | nonzero is true; result 1 or 0 | nonzero (NaN included) is true; result 1.0 or 0.0 |
//!
//! **Float `Min`/`Max`** follow C `fmin`/`fmax`: a NaN operand is ignored (the other operand is
//! the result; two NaNs give the second one). C leaves the sign of a zero result open; here
//! `Min` prefers `-0.0` and `Max` prefers `+0.0`, so for any two operands that are not both NaN
//! the result does not depend on their order. The collectives additionally fix the operand order
//! (lower ranks on the left), so results are bitwise reproducible even for NaN payloads.
//!
//! **Type checking.** Which operators a type supports is checked at run time
//! ([`Reducible::supports`]) before any communication starts; [`Bitwise`] is a marker
//! implemented only for the integer types, for code that wants the bitwise operators to be a
//! compile-time guarantee (`fn f<T: Bitwise>(...)`: every [`Op`] is valid for `T`).
//!
//! Large buffers are combined in parallel with rayon above [`PAR_THRESHOLD_BYTES`].
//!
//! **User-defined operators.** [`UserOp`] wraps a closure over any `Pod` type (a user
//! `#[repr(C)]` struct included); the `*_with` collectives ([`crate::Comm::allreduce_with`],
//! [`crate::Comm::iscan_with`], ...) take one. They always combine in rank order (lower ranks
//! on the left), so an operator that is not commutative (matrix products, "last writer wins")
//! gives the result MPI defines for it. [`UserOp::min_loc`] and [`UserOp::max_loc`] are MPI's
//! `MINLOC`/`MAXLOC` on [`Loc`] value-and-index pairs.

use std::fmt;

use rayon::prelude::*;

use crate::error::{Error, Result};

/// A predefined reduction operator. All of them are commutative and associative in exact
/// arithmetic (floats round, so the collectives fix the order in which operands combine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `a + b` (integers wrap).
    Sum,
    /// `a * b` (integers wrap).
    Prod,
    /// The smaller operand (floats: `fmin`, see the module docs).
    Min,
    /// The larger operand (floats: `fmax`, see the module docs).
    Max,
    /// `a & b` (integers only).
    BitAnd,
    /// `a | b` (integers only).
    BitOr,
    /// `a ^ b` (integers only).
    BitXor,
    /// `(a != 0) && (b != 0)` as 1 or 0.
    LogicalAnd,
    /// `(a != 0) || (b != 0)` as 1 or 0.
    LogicalOr,
}

impl Op {
    /// Every operator, in declaration order.
    pub const ALL: [Op; 9] = [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::BitAnd, Op::BitOr, Op::BitXor, Op::LogicalAnd, Op::LogicalOr];

    /// The operator's name, as in C MPI (`"MPI_SUM"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Op::Sum => "MPI_SUM",
            Op::Prod => "MPI_PROD",
            Op::Min => "MPI_MIN",
            Op::Max => "MPI_MAX",
            Op::BitAnd => "MPI_BAND",
            Op::BitOr => "MPI_BOR",
            Op::BitXor => "MPI_BXOR",
            Op::LogicalAnd => "MPI_LAND",
            Op::LogicalOr => "MPI_LOR",
        }
    }

    /// True for `BitAnd`, `BitOr`, `BitXor` (defined for integers only).
    pub const fn is_bitwise(self) -> bool {
        matches!(self, Op::BitAnd | Op::BitOr | Op::BitXor)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Buffers of at least this many bytes are combined in parallel (rayon), in chunks of
/// [`PAR_CHUNK_BYTES`]. Measured on the 2-core development machine (`combine_cost` in
/// `bench/`, f64 sum): parallel is slower up to 1 MiB (49 us serial vs
/// 66 us; the rayon hand-off costs ~20-30 us) and faster from 4 MiB (263 us vs 160 us), where
/// memory bandwidth becomes the limit. Ranks that share cores gain less, so the bar is high.
pub const PAR_THRESHOLD_BYTES: usize = 2 * 1024 * 1024;

/// Chunk size of the parallel combine: large enough that rayon's per-task cost is negligible.
pub const PAR_CHUNK_BYTES: usize = 128 * 1024;

mod sealed {
    pub trait Sealed {}
}

/// An element type that the predefined operators combine: the primitive integers and floats.
///
/// Sealed: the runtime's wire and reduction code rely on these being plain primitives.
pub trait Reducible: bytemuck::Pod + Send + Sync + sealed::Sealed {
    /// The Rust name of the type (`"f64"`), for error messages.
    const TYPE_NAME: &'static str;

    /// Whether `op` is defined for this type (bitwise operators are not defined for floats).
    fn supports(op: Op) -> bool;

    /// `acc[i] = acc[i] op other[i]` for every `i`.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] when `op` is not defined for the type; [`Error::InvalidBuffer`] when
    /// the lengths differ. `acc` is unchanged on error.
    fn reduce_into(op: Op, acc: &mut [Self], other: &[Self]) -> Result<()> {
        combine(op, acc, other, false)
    }

    /// `acc[i] = left[i] op acc[i]` for every `i`: like [`Reducible::reduce_into`] with the
    /// incoming operand on the left. Collectives use it to keep a fixed operand order.
    ///
    /// # Errors
    /// As [`Reducible::reduce_into`].
    fn reduce_into_from_left(op: Op, left: &[Self], acc: &mut [Self]) -> Result<()> {
        combine(op, acc, left, true)
    }

    /// The element kernel: `acc[i] = f(acc[i], other[i])`, or `f(other[i], acc[i])` when
    /// `other_left`. Lengths are equal and `op` is supported (checked by the caller).
    #[doc(hidden)]
    fn kernel(op: Op, acc: &mut [Self], other: &[Self], other_left: bool);
}

/// Marker for types on which every [`Op`] is defined (the integers). Use it as a bound to make
/// "bitwise operator on a float" a compile-time error instead of [`Error::InvalidOp`].
pub trait Bitwise: Reducible {}

/// Checks that `op` is defined for `T`.
///
/// # Errors
/// [`Error::InvalidOp`].
pub fn check_op<T: Reducible>(op: Op) -> Result<()> {
    if T::supports(op) {
        Ok(())
    } else {
        Err(invalid_op::<T>(op))
    }
}

#[cold]
fn invalid_op<T: Reducible>(op: Op) -> Error {
    Error::InvalidOp { op: op.name(), ty: T::TYPE_NAME }
}

fn combine<T: Reducible>(op: Op, acc: &mut [T], other: &[T], other_left: bool) -> Result<()> {
    check_op::<T>(op)?;
    if acc.len() != other.len() {
        return Err(Error::InvalidBuffer(format!("reduction of {} elements with {} elements", acc.len(), other.len())));
    }
    let bytes = std::mem::size_of_val(acc);
    if bytes >= PAR_THRESHOLD_BYTES {
        let chunk = (PAR_CHUNK_BYTES / std::mem::size_of::<T>().max(1)).max(1);
        acc.par_chunks_mut(chunk).zip(other.par_chunks(chunk)).for_each(|(a, o)| T::kernel(op, a, o, other_left));
    } else {
        T::kernel(op, acc, other, other_left);
    }
    Ok(())
}

/// Applies `f` elementwise; kept tiny and `inline(always)` so each (type, op) pair gets its own
/// vectorizable loop.
#[inline(always)]
fn apply<T: Copy>(acc: &mut [T], other: &[T], other_left: bool, f: impl Fn(T, T) -> T) {
    if other_left {
        for (a, &o) in acc.iter_mut().zip(other) {
            *a = f(o, *a);
        }
    } else {
        for (a, &o) in acc.iter_mut().zip(other) {
            *a = f(*a, o);
        }
    }
}

macro_rules! int_reducible {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Bitwise for $t {}
        impl Reducible for $t {
            const TYPE_NAME: &'static str = stringify!($t);
            fn supports(_op: Op) -> bool {
                true
            }
            fn kernel(op: Op, acc: &mut [Self], other: &[Self], left: bool) {
                match op {
                    Op::Sum => apply(acc, other, left, <$t>::wrapping_add),
                    Op::Prod => apply(acc, other, left, <$t>::wrapping_mul),
                    Op::Min => apply(acc, other, left, |a, b| if b < a { b } else { a }),
                    Op::Max => apply(acc, other, left, |a, b| if b > a { b } else { a }),
                    Op::BitAnd => apply(acc, other, left, |a, b| a & b),
                    Op::BitOr => apply(acc, other, left, |a, b| a | b),
                    Op::BitXor => apply(acc, other, left, |a, b| a ^ b),
                    Op::LogicalAnd => {
                        apply(acc, other, left, |a, b| <$t>::from((a != 0) & (b != 0)))
                    }
                    Op::LogicalOr => {
                        apply(acc, other, left, |a, b| <$t>::from((a != 0) | (b != 0)))
                    }
                }
            }
        }
    )*};
}

int_reducible!(i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize);

macro_rules! float_reducible {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Reducible for $t {
            const TYPE_NAME: &'static str = stringify!($t);
            fn supports(op: Op) -> bool {
                !op.is_bitwise()
            }
            fn kernel(op: Op, acc: &mut [Self], other: &[Self], left: bool) {
                match op {
                    Op::Sum => apply(acc, other, left, |a, b| a + b),
                    Op::Prod => apply(acc, other, left, |a, b| a * b),
                    // fmin: a NaN operand loses; -0.0 < +0.0; two NaNs give `b`.
                    Op::Min => apply(acc, other, left, |a, b| {
                        if a < b || (a == b && a.is_sign_negative()) || b.is_nan() {
                            a
                        } else {
                            b
                        }
                    }),
                    Op::Max => apply(acc, other, left, |a, b| {
                        if a > b || (a == b && a.is_sign_positive()) || b.is_nan() {
                            a
                        } else {
                            b
                        }
                    }),
                    Op::LogicalAnd => apply(acc, other, left, |a, b| {
                        if a != 0.0 && b != 0.0 { 1.0 } else { 0.0 }
                    }),
                    Op::LogicalOr => apply(acc, other, left, |a, b| {
                        if a != 0.0 || b != 0.0 { 1.0 } else { 0.0 }
                    }),
                    // Unreachable through the public API (`combine` checks `supports`); leave
                    // `acc` untouched rather than panic.
                    Op::BitAnd | Op::BitOr | Op::BitXor => {}
                }
            }
        }
    )*};
}

float_reducible!(f32, f64);

/// The element function of a [`UserOp`].
type ElemFn<T> = dyn Fn(&T, &T) -> T + Send + Sync;

/// A user-defined reduction operator on `T`: `f(a, b)` is `a op b`, where `a` comes from lower
/// ranks than `b`. Cheap to clone, and `Send + Sync` (one operator may serve every rank of
/// [`crate::run_local`]).
///
/// The operator must be associative (MPI's rule too): the collectives group operands
/// differently depending on the rank count. It need not be commutative: operands are never
/// swapped. Whether it is commutative is recorded ([`UserOp::is_commutative`]) for algorithms
/// that could use it; today every `*_with` collective keeps rank order either way.
///
/// ```
/// use tmpi::UserOp;
/// // 2x2 matrix product: associative, not commutative.
/// let matmul = UserOp::new(false, |a: &[i64; 4], b: &[i64; 4]| {
///     [a[0] * b[0] + a[1] * b[2], a[0] * b[1] + a[1] * b[3], a[2] * b[0] + a[3] * b[2], a[2] * b[1] + a[3] * b[3]]
/// });
/// let got = tmpi::run_local(3, |w| {
///     let m = [[1, 1, 0, 1], [2, 0, 0, 1], [0, 1, 1, 0]][w.rank()];
///     let mut prod = [[0i64; 4]];
///     w.allreduce_with(&[m], &mut prod, &matmul).unwrap();
///     prod[0]
/// });
/// // [[1,1],[0,1]] x [[2,0],[0,1]] x [[0,1],[1,0]] in rank order
/// assert!(got.iter().all(|p| p == &[1, 2, 1, 0]));
/// ```
pub struct UserOp<T> {
    f: std::sync::Arc<ElemFn<T>>,
    commutative: bool,
}

impl<T> Clone for UserOp<T> {
    fn clone(&self) -> Self {
        UserOp { f: self.f.clone(), commutative: self.commutative }
    }
}

impl<T> fmt::Debug for UserOp<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserOp").field("commutative", &self.commutative).finish()
    }
}

impl<T: bytemuck::Pod> UserOp<T> {
    /// An operator from an element function `f(a, b) = a op b`.
    pub fn new(commutative: bool, f: impl Fn(&T, &T) -> T + Send + Sync + 'static) -> Self {
        UserOp { f: std::sync::Arc::new(f), commutative }
    }

    /// Whether it was declared commutative.
    pub fn is_commutative(&self) -> bool {
        self.commutative
    }

    /// `a op b`.
    pub fn apply(&self, a: &T, b: &T) -> T {
        (self.f)(a, b)
    }

    /// `acc[i] = left[i] op acc[i]` when `other_left`, else `acc[i] = acc[i] op other[i]`.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when the lengths differ (`acc` is then unchanged).
    pub fn combine(&self, acc: &mut [T], other: &[T], other_left: bool) -> Result<()> {
        if acc.len() != other.len() {
            return Err(Error::InvalidBuffer(format!("reduction of {} elements with {} elements", acc.len(), other.len())));
        }
        for (a, o) in acc.iter_mut().zip(other) {
            *a = if other_left { (self.f)(o, a) } else { (self.f)(a, o) };
        }
        Ok(())
    }
}

/// A value and its index, for [`UserOp::min_loc`] and [`UserOp::max_loc`] (MPI's `MINLOC` and
/// `MAXLOC` pair types, such as `MPI_DOUBLE_INT`). `#[repr(C)]`, and `Pod` for the pairs
/// without padding: `(f64, u64)`, `(f64, i64)`, `(f32, u32)`, `(f32, i32)`, `(i32, i32)`,
/// `(i32, u32)`, `(u32, u32)`, `(i64, i64)`, `(i64, u64)`, `(u64, u64)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Loc<V, I> {
    /// The value compared.
    pub value: V,
    /// Where it came from (a rank, an element index, ...).
    pub index: I,
}

macro_rules! loc_pod {
    ($(($v:ty, $i:ty)),*) => {$(
        // SAFETY: `Loc` is `#[repr(C)]` with two fields of the same size and alignment, both
        // `Pod`: no padding, every bit pattern valid, zero is valid.
        unsafe impl bytemuck::Zeroable for Loc<$v, $i> {}
        // SAFETY: as above; `Loc` is `Copy` and `'static`.
        unsafe impl bytemuck::Pod for Loc<$v, $i> {}
    )*};
}

loc_pod!((f64, u64), (f64, i64), (f32, u32), (f32, i32), (i32, i32), (i32, u32), (u32, u32), (i64, i64), (i64, u64), (u64, u64));

/// A value not comparable with itself (a float NaN).
fn is_nan<V: PartialOrd>(v: &V) -> bool {
    v.partial_cmp(v).is_none()
}

impl<V: PartialOrd + Copy, I: Ord + Copy> UserOp<Loc<V, I>>
where
    Loc<V, I>: bytemuck::Pod,
{
    /// MPI's `MINLOC`: the smaller value, and on a tie the smaller index. Commutative.
    ///
    /// ```
    /// use tmpi::{Loc, UserOp};
    /// let got = tmpi::run_local(4, |w| {
    ///     let v = [3.0, 1.0, 7.0, 1.0][w.rank()];
    ///     let mut m = [Loc { value: 0.0, index: 0u64 }];
    ///     w.allreduce_with(&[Loc { value: v, index: w.rank() as u64 }], &mut m, &UserOp::min_loc()).unwrap();
    ///     m[0]
    /// });
    /// assert!(got.iter().all(|m| *m == Loc { value: 1.0, index: 1 }));
    /// ```
    pub fn min_loc() -> Self {
        UserOp::new(
            true,
            |a: &Loc<V, I>, b: &Loc<V, I>| {
                if a.value < b.value || (a.value == b.value && a.index <= b.index) || is_nan(&b.value) {
                    *a
                } else {
                    *b
                }
            },
        )
    }

    /// MPI's `MAXLOC`: the larger value, and on a tie the smaller index. Commutative.
    pub fn max_loc() -> Self {
        UserOp::new(
            true,
            |a: &Loc<V, I>, b: &Loc<V, I>| {
                if a.value > b.value || (a.value == b.value && a.index <= b.index) || is_nan(&b.value) {
                    *a
                } else {
                    *b
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_op_order_and_loc() {
        let cat = UserOp::new(false, |a: &u32, b: &u32| a * 10 + b);
        let mut acc = vec![1u32, 2];
        cat.combine(&mut acc, &[3, 4], false).unwrap();
        assert_eq!(acc, vec![13, 24]);
        cat.combine(&mut acc, &[5, 6], true).unwrap();
        assert_eq!(acc, vec![63, 84]);
        assert!(cat.combine(&mut acc, &[1], true).is_err());
        assert!(!cat.is_commutative());
        let min = UserOp::<Loc<f64, u64>>::min_loc();
        let max = UserOp::<Loc<f64, u64>>::max_loc();
        let (a, b) = (Loc { value: 1.0, index: 5 }, Loc { value: 1.0, index: 2 });
        assert_eq!(min.apply(&a, &b), b);
        assert_eq!(min.apply(&b, &a), b);
        assert_eq!(max.apply(&a, &b), b);
        let c = Loc { value: 3.0, index: 9 };
        assert_eq!(min.apply(&c, &a), a);
        assert_eq!(max.apply(&a, &c), c);
        assert!(min.is_commutative());
    }

    #[test]
    fn int_ops_match_scalar_definitions() {
        let a: Vec<i32> = vec![0, 1, -1, 7, i32::MAX, i32::MIN, 12, 0, 5];
        let b: Vec<i32> = vec![0, 0, 3, -7, 1, -1, 10, 9, 5];
        type Scalar = fn(i32, i32) -> i32;
        let cases: [(Op, Scalar); 9] = [
            (Op::Sum, i32::wrapping_add),
            (Op::Prod, i32::wrapping_mul),
            (Op::Min, |x, y| x.min(y)),
            (Op::Max, |x, y| x.max(y)),
            (Op::BitAnd, |x, y| x & y),
            (Op::BitOr, |x, y| x | y),
            (Op::BitXor, |x, y| x ^ y),
            (Op::LogicalAnd, |x, y| i32::from(x != 0 && y != 0)),
            (Op::LogicalOr, |x, y| i32::from(x != 0 || y != 0)),
        ];
        for (op, f) in cases {
            let mut acc = a.clone();
            i32::reduce_into(op, &mut acc, &b).unwrap();
            let want: Vec<i32> = a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect();
            assert_eq!(acc, want, "{op}");
            let mut acc = b.clone();
            i32::reduce_into_from_left(op, &a, &mut acc).unwrap();
            assert_eq!(acc, want, "{op} from left");
        }
        let mut u = vec![u8::MAX, 200];
        u8::reduce_into(Op::Sum, &mut u, &[1, 100]).unwrap();
        assert_eq!(u, vec![0, 44]);
        let mut w = vec![u128::MAX];
        u128::reduce_into(Op::Prod, &mut w, &[2]).unwrap();
        assert_eq!(w, vec![u128::MAX - 1]);
    }

    #[test]
    fn float_ops() {
        let nan = f64::NAN;
        let mut a = vec![1.5, -2.0, nan, 3.0, nan, 0.0, -0.0, 0.0];
        let b = vec![2.5, 4.0, 1.0, nan, nan, -0.0, 0.0, 7.0];
        let mut m = a.clone();
        f64::reduce_into(Op::Min, &mut m, &b).unwrap();
        assert_eq!(m[..4], [1.5, -2.0, 1.0, 3.0]);
        assert!(m[4].is_nan());
        assert!(m[5] == 0.0 && m[5].is_sign_negative());
        assert!(m[6] == 0.0 && m[6].is_sign_negative());
        assert_eq!(m[7], 0.0);
        let mut x = a.clone();
        f64::reduce_into(Op::Max, &mut x, &b).unwrap();
        assert_eq!(x[..4], [2.5, 4.0, 1.0, 3.0]);
        assert!(x[5] == 0.0 && x[5].is_sign_positive());
        assert!(x[6] == 0.0 && x[6].is_sign_positive());
        assert_eq!(x[7], 7.0);
        // Min/Max do not depend on operand order except for two NaNs.
        for op in [Op::Min, Op::Max] {
            let mut l = a.clone();
            f64::reduce_into(op, &mut l, &b).unwrap();
            let mut r = a.clone();
            f64::reduce_into_from_left(op, &b, &mut r).unwrap();
            for i in [0, 1, 2, 3, 5, 6, 7] {
                assert_eq!(l[i].to_bits(), r[i].to_bits(), "{op} {i}");
            }
        }
        let mut l = a.clone();
        f64::reduce_into(Op::LogicalAnd, &mut l, &b).unwrap();
        assert_eq!(l, vec![1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
        f64::reduce_into(Op::LogicalOr, &mut a, &b).unwrap();
        assert_eq!(a, vec![1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0]);
        let mut s = vec![1.0f32, 2.0];
        f32::reduce_into(Op::Prod, &mut s, &[3.0, 0.5]).unwrap();
        assert_eq!(s, vec![3.0, 1.0]);
    }

    #[test]
    fn bitwise_on_float_is_an_error() {
        for op in [Op::BitAnd, Op::BitOr, Op::BitXor] {
            let mut a = vec![1.0f32];
            let e = f32::reduce_into(op, &mut a, &[2.0]).unwrap_err();
            assert!(matches!(e, Error::InvalidOp { ty: "f32", .. }), "{e}");
            assert_eq!(a, vec![1.0]);
            assert!(check_op::<f64>(op).is_err());
            assert!(check_op::<u16>(op).is_ok());
        }
    }

    #[test]
    fn length_mismatch_is_an_error() {
        let mut a = vec![1u32, 2];
        let e = u32::reduce_into(Op::Sum, &mut a, &[1]).unwrap_err();
        assert!(matches!(e, Error::InvalidBuffer(_)), "{e}");
        assert_eq!(a, vec![1, 2]);
    }

    #[test]
    fn parallel_path_matches_serial() {
        let n = PAR_THRESHOLD_BYTES / 8 * 3 + 17;
        let a: Vec<f64> = (0..n).map(|i| (i as f64).sin()).collect();
        let b: Vec<f64> = (0..n).map(|i| (i as f64 * 0.7).cos()).collect();
        for op in [Op::Sum, Op::Prod, Op::Min, Op::Max] {
            let mut par = a.clone();
            f64::reduce_into(op, &mut par, &b).unwrap();
            let mut ser = a.clone();
            // Pieces below the threshold take the serial kernel.
            let piece = PAR_THRESHOLD_BYTES / 8 / 2;
            for (s, o) in ser.chunks_mut(piece).zip(b.chunks(piece)) {
                f64::reduce_into(op, s, o).unwrap();
            }
            let ser_bits: Vec<u64> = ser.iter().map(|x| x.to_bits()).collect();
            let par_bits: Vec<u64> = par.iter().map(|x| x.to_bits()).collect();
            assert!(ser_bits == par_bits, "{op}");
        }
    }
}
