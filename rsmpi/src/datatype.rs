//! Datatypes and buffers: what a message is made of.
//!
//! Every buffer is described as rsmpi describes it: a pointer, a count and a datatype. A
//! datatype here is a type map kept in Rust (byte runs in type-map order, the extent, where
//! `bool`s sit), built by [`UserDatatype`]'s constructors or by `#[derive(Equivalence)]`.
//! A buffer whose type has no gaps goes to tmpi as it is; any other is packed (and unpacked on
//! receipt), and a received `bool` that is neither 0 nor 1 stops the program with a message
//! instead of becoming an invalid value.

use std::borrow::Borrow;
use std::os::raw::c_void;
use std::sync::Arc;

use tmpi::{TypeMap, TypeMapBuilder};

use crate::ffi::MPI_Datatype;
use crate::{Address, Count};

/// The traits of this module that `mpi::traits::*` brings in.
pub mod traits {
    pub use super::{
        AsDatatype, Buffer, BufferMut, Collection, Datatype, Equivalence, Partitioned, PartitionedBuffer, PartitionedBufferMut,
    };
    pub use super::{Pointer, PointerMut, UncommittedDatatype};
}

/// The primitive element kinds a type map can be made of.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prim {
    /// `bool` (one byte, 0 or 1).
    Bool,
    /// `i8`.
    I8,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u8`.
    U8,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `u64`.
    U64,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// Two `f32`s (`Complex32`).
    C32,
    /// Two `f64`s (`Complex64`).
    C64,
}

impl Prim {
    /// Size in bytes.
    pub(crate) const fn size(self) -> usize {
        match self {
            Prim::Bool | Prim::I8 | Prim::U8 => 1,
            Prim::I16 | Prim::U16 => 2,
            Prim::I32 | Prim::U32 | Prim::F32 => 4,
            Prim::I64 | Prim::U64 | Prim::F64 | Prim::C32 => 8,
            Prim::C64 => 16,
        }
    }

    const fn align(self) -> usize {
        match self {
            Prim::C32 => 4,
            Prim::C64 => 8,
            p => p.size(),
        }
    }
}

/// A type map: what a datatype handle points at. The map itself (byte runs in type-map
/// order, bounds, where `bool`s sit) is tmpi's [`TypeMap`], built with tmpi's
/// [`TypeMapBuilder`] as `#[derive(tmpi::Element)]` builds one; this adds the one primitive
/// its bytes are made of, which predefined reductions need.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct TypeDesc {
    map: TypeMap,
    /// The one primitive every byte belongs to, if there is one.
    pub(crate) prim: Option<Prim>,
}

impl std::ops::Deref for TypeDesc {
    type Target = TypeMap;
    fn deref(&self) -> &TypeMap {
        &self.map
    }
}

impl TypeDesc {
    const fn primitive(p: Prim) -> TypeDesc {
        TypeDesc { map: TypeMap::primitive(p.size(), p.align(), matches!(p, Prim::Bool)), prim: Some(p) }
    }

    /// The raw handle of this type map.
    pub(crate) fn raw(&self) -> MPI_Datatype {
        MPI_Datatype(self as *const TypeDesc as *const c_void)
    }
}

/// Builds a type map from copies of other type maps (tmpi's builder, plus the common
/// primitive).
struct Builder {
    map: TypeMapBuilder,
    prim: Option<Option<Prim>>,
}

impl Builder {
    fn new() -> Builder {
        Builder { map: TypeMapBuilder::new(), prim: None }
    }

    /// Appends `copies` copies of `old`, the first at byte `disp`, each `old`'s extent apart.
    fn place(&mut self, old: &TypeDesc, disp: isize, copies: usize) {
        self.map.place(&old.map, disp, copies);
        if copies > 0 {
            self.prim = Some(match self.prim {
                None => old.prim,
                Some(p) if p == old.prim => p,
                Some(_) => None,
            });
        }
    }

    fn finish(self, round_to_align: bool) -> TypeDesc {
        TypeDesc { map: self.map.finish(round_to_align), prim: self.prim.flatten() }
    }
}

fn count_of(c: Count, what: &str) -> usize {
    usize::try_from(c).unwrap_or_else(|_| panic!("mpi: {what}: negative count {c}"))
}

fn check_same_len(a: usize, b: usize, what: &str) {
    assert!(a == b, "mpi: {what}: {a} block lengths but {b} displacements");
}

macro_rules! prim_statics {
    ($($name:ident = $p:ident),* $(,)?) => {
        $(static $name: TypeDesc = TypeDesc::primitive(Prim::$p);)*
    };
}
prim_statics!(
    BOOL = Bool,
    I8 = I8,
    I16 = I16,
    I32 = I32,
    I64 = I64,
    U8 = U8,
    U16 = U16,
    U32 = U32,
    U64 = U64,
    F32 = F32,
    F64 = F64,
    C32 = C32,
    C64 = C64,
);

/// A reference to a committed datatype.
#[derive(Copy, Clone, Debug)]
pub struct DatatypeRef<'a> {
    desc: &'a TypeDesc,
}

/// A reference to a datatype that may be uncommitted (a building block of other datatypes).
#[derive(Copy, Clone, Debug)]
pub struct UncommittedDatatypeRef<'a> {
    desc: &'a TypeDesc,
}

/// The datatype of a primitive Rust type.
pub type SystemDatatype = DatatypeRef<'static>;

impl<'a> DatatypeRef<'a> {
    pub(crate) fn of(desc: &'a TypeDesc) -> DatatypeRef<'a> {
        DatatypeRef { desc }
    }
}

impl<'a> From<DatatypeRef<'a>> for UncommittedDatatypeRef<'a> {
    fn from(d: DatatypeRef<'a>) -> Self {
        UncommittedDatatypeRef { desc: d.desc }
    }
}

impl<'a> From<&'a UserDatatype> for DatatypeRef<'a> {
    fn from(d: &'a UserDatatype) -> Self {
        d.as_ref()
    }
}

impl<'a> From<&'a UserDatatype> for UncommittedDatatypeRef<'a> {
    fn from(d: &'a UserDatatype) -> Self {
        UncommittedDatatypeRef { desc: &d.0 }
    }
}

impl<'a> From<&'a UncommittedUserDatatype> for UncommittedDatatypeRef<'a> {
    fn from(d: &'a UncommittedUserDatatype) -> Self {
        d.as_ref()
    }
}

/// Something that describes a layout of data (committed or not).
pub trait UncommittedDatatype {
    /// What [`UncommittedDatatype::dup`] returns.
    type DuplicatedDatatype;

    /// The type map (tmpi-rsmpi's representation of a datatype handle).
    #[doc(hidden)]
    fn type_desc(&self) -> &TypeDesc;

    /// A new datatype with the same layout (`MPI_Type_dup`).
    fn dup(&self) -> Self::DuplicatedDatatype;

    /// The raw handle (a pointer to the type map, valid while `self` lives).
    fn as_raw(&self) -> MPI_Datatype {
        self.type_desc().raw()
    }
}

/// A committed datatype: usable in communication.
pub trait Datatype: UncommittedDatatype {}

impl<'a, D: 'a + UncommittedDatatype + ?Sized> UncommittedDatatype for &'a D {
    type DuplicatedDatatype = D::DuplicatedDatatype;
    fn type_desc(&self) -> &TypeDesc {
        (**self).type_desc()
    }
    fn dup(&self) -> Self::DuplicatedDatatype {
        (**self).dup()
    }
}
impl<'a, D: 'a + Datatype + ?Sized> Datatype for &'a D {}

impl UncommittedDatatype for DatatypeRef<'_> {
    type DuplicatedDatatype = UserDatatype;
    fn type_desc(&self) -> &TypeDesc {
        self.desc
    }
    fn dup(&self) -> UserDatatype {
        UserDatatype(Arc::new(self.desc.clone()))
    }
}
impl Datatype for DatatypeRef<'_> {}

impl UncommittedDatatype for UncommittedDatatypeRef<'_> {
    type DuplicatedDatatype = UncommittedUserDatatype;
    fn type_desc(&self) -> &TypeDesc {
        self.desc
    }
    fn dup(&self) -> UncommittedUserDatatype {
        UncommittedUserDatatype(Arc::new(self.desc.clone()))
    }
}

/// A committed user-defined datatype.
#[derive(Clone, Debug)]
pub struct UserDatatype(Arc<TypeDesc>);

/// A user-defined datatype not yet committed (a building block for other datatypes).
#[derive(Clone, Debug)]
pub struct UncommittedUserDatatype(Arc<TypeDesc>);

impl UncommittedDatatype for UserDatatype {
    type DuplicatedDatatype = UserDatatype;
    fn type_desc(&self) -> &TypeDesc {
        &self.0
    }
    fn dup(&self) -> UserDatatype {
        UserDatatype(Arc::new((*self.0).clone()))
    }
}
impl Datatype for UserDatatype {}

impl UncommittedDatatype for UncommittedUserDatatype {
    type DuplicatedDatatype = UncommittedUserDatatype;
    fn type_desc(&self) -> &TypeDesc {
        &self.0
    }
    fn dup(&self) -> UncommittedUserDatatype {
        UncommittedUserDatatype(Arc::new((*self.0).clone()))
    }
}

impl UncommittedUserDatatype {
    /// `count` copies of `oldtype` one after another (`MPI_Type_contiguous`).
    pub fn contiguous<D: UncommittedDatatype>(count: Count, oldtype: &D) -> Self {
        let mut b = Builder::new();
        b.place(oldtype.type_desc(), 0, count_of(count, "contiguous"));
        Self::from_builder(b, false)
    }

    /// `count` blocks of `blocklength` elements, `stride` elements apart (`MPI_Type_vector`).
    pub fn vector<D: UncommittedDatatype>(count: Count, blocklength: Count, stride: Count, oldtype: &D) -> Self {
        let ext = oldtype.type_desc().extent();
        Self::heterogeneous_vector(count, blocklength, stride as Address * ext as Address, oldtype)
    }

    /// As [`UncommittedUserDatatype::vector`] with the stride in bytes (`MPI_Type_create_hvector`).
    pub fn heterogeneous_vector<D: UncommittedDatatype>(count: Count, blocklength: Count, stride: Address, oldtype: &D) -> Self {
        let mut b = Builder::new();
        let bl = count_of(blocklength, "vector");
        for i in 0..count_of(count, "vector") {
            b.place(oldtype.type_desc(), i as isize * stride, bl);
        }
        Self::from_builder(b, false)
    }

    /// Blocks of given lengths at given displacements in elements (`MPI_Type_indexed`).
    pub fn indexed<D: UncommittedDatatype>(blocklengths: &[Count], displacements: &[Count], oldtype: &D) -> Self {
        let ext = oldtype.type_desc().extent() as Address;
        let d: Vec<Address> = displacements.iter().map(|&x| x as Address * ext).collect();
        Self::heterogeneous_indexed(blocklengths, &d, oldtype)
    }

    /// As [`UncommittedUserDatatype::indexed`] with displacements in bytes.
    pub fn heterogeneous_indexed<D: UncommittedDatatype>(blocklengths: &[Count], displacements: &[Address], oldtype: &D) -> Self {
        check_same_len(blocklengths.len(), displacements.len(), "indexed");
        let mut b = Builder::new();
        for (&bl, &d) in blocklengths.iter().zip(displacements) {
            b.place(oldtype.type_desc(), d, count_of(bl, "indexed"));
        }
        Self::from_builder(b, false)
    }

    /// Blocks of one length at given displacements in elements (`MPI_Type_create_indexed_block`).
    pub fn indexed_block<D: UncommittedDatatype>(blocklength: Count, displacements: &[Count], oldtype: &D) -> Self {
        let bl = vec![blocklength; displacements.len()];
        Self::indexed(&bl, displacements, oldtype)
    }

    /// As [`UncommittedUserDatatype::indexed_block`] with displacements in bytes.
    pub fn heterogeneous_indexed_block<D: UncommittedDatatype>(blocklength: Count, displacements: &[Address], oldtype: &D) -> Self {
        let bl = vec![blocklength; displacements.len()];
        Self::heterogeneous_indexed(&bl, displacements, oldtype)
    }

    /// Fields of several types at byte displacements (`MPI_Type_create_struct`); the extent is
    /// rounded up to the largest alignment among the fields, as C MPI does.
    pub fn structured<D: UncommittedDatatype>(blocklengths: &[Count], displacements: &[Address], types: &[D]) -> Self {
        check_same_len(blocklengths.len(), displacements.len(), "structured");
        assert!(types.len() == blocklengths.len(), "mpi: structured: {} block lengths but {} types", blocklengths.len(), types.len());
        let mut b = Builder::new();
        for ((&bl, &d), t) in blocklengths.iter().zip(displacements).zip(types) {
            b.place(t.type_desc(), d, count_of(bl, "structured"));
        }
        Self::from_builder(b, true)
    }

    fn from_builder(b: Builder, round: bool) -> Self {
        UncommittedUserDatatype(Arc::new(b.finish(round)))
    }

    /// Commits the datatype for use in communication.
    pub fn commit(self) -> UserDatatype {
        UserDatatype(self.0)
    }

    /// A reference to the datatype.
    pub fn as_ref(&self) -> UncommittedDatatypeRef<'_> {
        UncommittedDatatypeRef { desc: &self.0 }
    }
}

impl UserDatatype {
    /// See [`UncommittedUserDatatype::contiguous`].
    pub fn contiguous<D: UncommittedDatatype>(count: Count, oldtype: &D) -> UserDatatype {
        UncommittedUserDatatype::contiguous(count, oldtype).commit()
    }
    /// See [`UncommittedUserDatatype::vector`].
    pub fn vector<D: UncommittedDatatype>(count: Count, blocklength: Count, stride: Count, oldtype: &D) -> UserDatatype {
        UncommittedUserDatatype::vector(count, blocklength, stride, oldtype).commit()
    }
    /// See [`UncommittedUserDatatype::heterogeneous_vector`].
    pub fn heterogeneous_vector<D: UncommittedDatatype>(count: Count, blocklength: Count, stride: Address, oldtype: &D) -> UserDatatype {
        UncommittedUserDatatype::heterogeneous_vector(count, blocklength, stride, oldtype).commit()
    }
    /// See [`UncommittedUserDatatype::indexed`].
    pub fn indexed<D: UncommittedDatatype>(blocklengths: &[Count], displacements: &[Count], oldtype: &D) -> UserDatatype {
        UncommittedUserDatatype::indexed(blocklengths, displacements, oldtype).commit()
    }
    /// See [`UncommittedUserDatatype::heterogeneous_indexed`].
    pub fn heterogeneous_indexed<D: UncommittedDatatype>(blocklengths: &[Count], displacements: &[Address], oldtype: &D) -> UserDatatype {
        UncommittedUserDatatype::heterogeneous_indexed(blocklengths, displacements, oldtype).commit()
    }
    /// See [`UncommittedUserDatatype::indexed_block`].
    pub fn indexed_block<D: UncommittedDatatype>(blocklength: Count, displacements: &[Count], oldtype: &D) -> UserDatatype {
        UncommittedUserDatatype::indexed_block(blocklength, displacements, oldtype).commit()
    }
    /// See [`UncommittedUserDatatype::heterogeneous_indexed_block`].
    pub fn heterogeneous_indexed_block<D: UncommittedDatatype>(blocklength: Count, displacements: &[Address], oldtype: &D) -> UserDatatype {
        UncommittedUserDatatype::heterogeneous_indexed_block(blocklength, displacements, oldtype).commit()
    }
    /// See [`UncommittedUserDatatype::structured`].
    pub fn structured<D: UncommittedDatatype>(blocklengths: &[Count], displacements: &[Address], types: &[D]) -> UserDatatype {
        UncommittedUserDatatype::structured(blocklengths, displacements, types).commit()
    }
    /// A reference to the datatype.
    pub fn as_ref(&self) -> DatatypeRef<'_> {
        DatatypeRef { desc: &self.0 }
    }
}

/// A type whose values can be sent: it names the datatype that describes it.
///
/// # Safety
/// The datatype must describe exactly the bytes of `Self` that carry its value, at their
/// offsets, with the extent `size_of::<Self>()`; every bit pattern the datatype can deliver
/// into those bytes must be a valid `Self` (`bool` bytes are checked on receipt).
pub unsafe trait Equivalence {
    /// The datatype's type.
    type Out: Datatype;
    /// The datatype that describes `Self`.
    fn equivalent_datatype() -> Self::Out;
}

macro_rules! equivalent_prim {
    ($($t:ty => $s:ident),* $(,)?) => {
        $(
            // SAFETY: the primitive type map covers the whole value; every bit pattern is a
            // valid value (bool bytes are checked on receipt).
            unsafe impl Equivalence for $t {
                type Out = SystemDatatype;
                fn equivalent_datatype() -> SystemDatatype {
                    DatatypeRef { desc: &$s }
                }
            }
        )*
    };
}
equivalent_prim!(bool => BOOL, i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64, f32 => F32, f64 => F64);
#[cfg(target_pointer_width = "64")]
equivalent_prim!(usize => U64, isize => I64);
#[cfg(target_pointer_width = "32")]
equivalent_prim!(usize => U32, isize => I32);

/// `Equivalence` for num-complex's types (feature `complex`).
#[cfg(feature = "complex")]
pub mod complex_datatype {
    use super::{DatatypeRef, Equivalence, SystemDatatype, C32, C64};
    use num_complex::{Complex32, Complex64};

    // SAFETY: `Complex<T>` is `repr(C)` with two `T`s; the map covers both.
    unsafe impl Equivalence for Complex32 {
        type Out = SystemDatatype;
        fn equivalent_datatype() -> SystemDatatype {
            DatatypeRef { desc: &C32 }
        }
    }
    // SAFETY: as above.
    unsafe impl Equivalence for Complex64 {
        type Out = SystemDatatype;
        fn equivalent_datatype() -> SystemDatatype {
            DatatypeRef { desc: &C64 }
        }
    }
}

/// Something that names the datatype of its elements.
///
/// # Safety
/// The datatype must describe the memory that [`Pointer`]/[`PointerMut`] and [`Collection`]
/// give for the same value.
pub unsafe trait AsDatatype {
    /// The datatype's type.
    type Out: Datatype;
    /// The datatype.
    fn as_datatype(&self) -> Self::Out;
}

/// Something with a number of elements.
///
/// # Safety
/// The count must not exceed the elements at the pointer.
pub unsafe trait Collection {
    /// The number of elements.
    fn count(&self) -> Count;
}

/// Something with a readable address.
///
/// # Safety
/// The pointer must be valid for reads of what the datatype and count describe.
pub unsafe trait Pointer {
    /// The address of the first element.
    fn pointer(&self) -> *const c_void;
}

/// Something with a writable address.
///
/// # Safety
/// The pointer must be valid for writes of what the datatype and count describe.
pub unsafe trait PointerMut {
    /// The address of the first element.
    fn pointer_mut(&mut self) -> *mut c_void;
}

/// A readable buffer: pointer, count and datatype.
///
/// # Safety
/// The three parts must agree (see their traits).
pub unsafe trait Buffer: Pointer + Collection + AsDatatype {}

/// A writable buffer: pointer, count and datatype.
///
/// # Safety
/// As [`Buffer`].
pub unsafe trait BufferMut: PointerMut + Collection + AsDatatype {}

fn to_count(n: usize) -> Count {
    Count::try_from(n).unwrap_or_else(|_| panic!("mpi: {n} elements do not fit a Count (i32)"))
}

macro_rules! buffer_impls {
    ($(($($g:tt)*) $t:ty, $n:expr, $p:expr, $pm:expr;)*) => {$(
        // SAFETY: the datatype is T's; count and pointer describe the value's elements.
        unsafe impl<$($g)*> AsDatatype for $t {
            type Out = <T as Equivalence>::Out;
            fn as_datatype(&self) -> Self::Out {
                T::equivalent_datatype()
            }
        }
        // SAFETY: as above.
        unsafe impl<$($g)*> Collection for $t {
            #[allow(clippy::redundant_closure_call)]
            fn count(&self) -> Count {
                ($n)(self)
            }
        }
        // SAFETY: as above.
        unsafe impl<$($g)*> Pointer for $t {
            #[allow(clippy::redundant_closure_call)]
            fn pointer(&self) -> *const c_void {
                ($p)(self)
            }
        }
        // SAFETY: as above.
        unsafe impl<$($g)*> PointerMut for $t {
            #[allow(clippy::redundant_closure_call)]
            fn pointer_mut(&mut self) -> *mut c_void {
                ($pm)(self)
            }
        }
        // SAFETY: as above.
        unsafe impl<$($g)*> Buffer for $t {}
        // SAFETY: as above.
        unsafe impl<$($g)*> BufferMut for $t {}
    )*};
}
buffer_impls! {
    (T: Equivalence) T, |_: &T| 1, |x: &T| x as *const T as *const c_void, |x: &mut T| x as *mut T as *mut c_void;
    (T: Equivalence) [T], |x: &[T]| to_count(x.len()), |x: &[T]| x.as_ptr() as *const c_void, |x: &mut [T]| x.as_mut_ptr() as *mut c_void;
    (T: Equivalence) Vec<T>, |x: &Vec<T>| to_count(x.len()), |x: &Vec<T>| x.as_ptr() as *const c_void, |x: &mut Vec<T>| x.as_mut_ptr() as *mut c_void;
    (T: Equivalence, const D: usize) [T; D], |_: &[T; D]| to_count(D), |x: &[T; D]| x.as_ptr() as *const c_void, |x: &mut [T; D]| x.as_mut_ptr() as *mut c_void;
}

/// A read-only buffer of elements whose type is known only at run time (what a
/// [`UserOperation`](crate::collective::UserOperation) is given).
#[derive(Copy, Clone, Debug)]
pub struct DynBuffer<'a> {
    ptr: *const c_void,
    len: Count,
    datatype: DatatypeRef<'a>,
}

// SAFETY: a DynBuffer is a shared borrow of plain data.
unsafe impl Send for DynBuffer<'_> {}
// SAFETY: as above.
unsafe impl Sync for DynBuffer<'_> {}

// SAFETY: fields given at construction (checked by `new` or promised by `from_raw`).
unsafe impl Collection for DynBuffer<'_> {
    fn count(&self) -> Count {
        self.len
    }
}
// SAFETY: as above.
unsafe impl Pointer for DynBuffer<'_> {
    fn pointer(&self) -> *const c_void {
        self.ptr
    }
}
// SAFETY: as above.
unsafe impl<'a> AsDatatype for DynBuffer<'a> {
    type Out = DatatypeRef<'a>;
    fn as_datatype(&self) -> DatatypeRef<'a> {
        self.datatype
    }
}
// SAFETY: as above.
unsafe impl Buffer for DynBuffer<'_> {}

fn same_type<T: Equivalence>(d: &TypeDesc) -> bool {
    let t = T::equivalent_datatype();
    let td = t.type_desc();
    std::ptr::eq(td, d) || (td.prim.is_some() && td.prim == d.prim && td.size() == d.size() && d.is_dense())
}

impl<'a> DynBuffer<'a> {
    /// A buffer over a slice.
    pub fn new<T: Equivalence>(buf: &'a [T]) -> Self {
        let len = to_count(buf.len());
        let dt = T::equivalent_datatype();
        // SAFETY: a slice of T described by T's datatype.
        unsafe { Self::from_raw(buf.as_ptr(), len, DatatypeRef { desc: extend(dt.type_desc()) }) }
    }

    /// Whether the elements are `T`s.
    pub fn is<T: Equivalence>(&self) -> bool {
        same_type::<T>(self.datatype.desc)
    }

    /// The elements as a slice of `T`, if they are `T`s.
    pub fn downcast<T: Equivalence>(self) -> Option<&'a [T]> {
        if !self.is::<T>() || (self.ptr as usize) % std::mem::align_of::<T>() != 0 {
            return None;
        }
        // SAFETY: the buffer holds `len` elements of T's datatype (checked above), aligned.
        Some(unsafe { std::slice::from_raw_parts(self.ptr as *const T, self.len as usize) })
    }

    /// A buffer from its parts.
    ///
    /// # Safety
    /// `ptr` must point at `len` elements described by `datatype`, valid for `'a`.
    pub unsafe fn from_raw<T>(ptr: *const T, len: Count, datatype: DatatypeRef<'a>) -> Self {
        DynBuffer { ptr: ptr as *const c_void, len, datatype }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first element.
    pub fn as_ptr(&self) -> *const c_void {
        self.ptr
    }
}

/// The type map of a primitive datatype lives in a static; a derived one lives as long as its
/// owner, which a `DynBuffer::new` caller's `T::Out` does not outlive... except that rsmpi's
/// `Equivalence::Out` for derived types is a `DatatypeRef<'static>` or a fresh `UserDatatype`.
/// A fresh one is leaked here (once per call of `DynBuffer::new` on such a type; rare).
fn extend(d: &TypeDesc) -> &'static TypeDesc {
    static PRIMS: [&TypeDesc; 13] = [&BOOL, &I8, &I16, &I32, &I64, &U8, &U16, &U32, &U64, &F32, &F64, &C32, &C64];
    if let Some(p) = PRIMS.iter().find(|p| p.prim == d.prim && p.size() == d.size() && d.is_dense() && d.bools().len() == p.bools().len()) {
        return p;
    }
    Box::leak(Box::new(d.clone()))
}

/// A writable buffer of elements whose type is known only at run time.
#[derive(Debug)]
pub struct DynBufferMut<'a> {
    ptr: *mut c_void,
    len: Count,
    datatype: DatatypeRef<'a>,
}

// SAFETY: a DynBufferMut is an exclusive borrow of plain data.
unsafe impl Send for DynBufferMut<'_> {}
// SAFETY: as above.
unsafe impl Sync for DynBufferMut<'_> {}
// SAFETY: fields given at construction.
unsafe impl Collection for DynBufferMut<'_> {
    fn count(&self) -> Count {
        self.len
    }
}
// SAFETY: as above.
unsafe impl Pointer for DynBufferMut<'_> {
    fn pointer(&self) -> *const c_void {
        self.ptr
    }
}
// SAFETY: as above.
unsafe impl PointerMut for DynBufferMut<'_> {
    fn pointer_mut(&mut self) -> *mut c_void {
        self.ptr
    }
}
// SAFETY: as above.
unsafe impl<'a> AsDatatype for DynBufferMut<'a> {
    type Out = DatatypeRef<'a>;
    fn as_datatype(&self) -> DatatypeRef<'a> {
        self.datatype
    }
}
// SAFETY: as above.
unsafe impl Buffer for DynBufferMut<'_> {}
// SAFETY: as above.
unsafe impl BufferMut for DynBufferMut<'_> {}

impl<'a> DynBufferMut<'a> {
    /// A buffer over a mutable slice.
    pub fn new<T: Equivalence>(buf: &'a mut [T]) -> Self {
        let len = to_count(buf.len());
        let dt = T::equivalent_datatype();
        // SAFETY: a slice of T described by T's datatype.
        unsafe { Self::from_raw(buf.as_mut_ptr(), len, DatatypeRef { desc: extend(dt.type_desc()) }) }
    }

    /// Whether the elements are `T`s.
    pub fn is<T: Equivalence>(&self) -> bool {
        same_type::<T>(self.datatype.desc)
    }

    /// The elements as a mutable slice of `T`, if they are `T`s.
    pub fn downcast<T: Equivalence>(self) -> Option<&'a mut [T]> {
        if !self.is::<T>() || (self.ptr as usize) % std::mem::align_of::<T>() != 0 {
            return None;
        }
        // SAFETY: the buffer holds `len` elements of T's datatype, aligned, borrowed mutably.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut T, self.len as usize) })
    }

    /// A buffer from its parts.
    ///
    /// # Safety
    /// `ptr` must point at `len` elements described by `datatype`, valid for writes for `'a`.
    pub unsafe fn from_raw<T>(ptr: *mut T, len: Count, datatype: DatatypeRef<'a>) -> Self {
        DynBufferMut { ptr: ptr as *mut c_void, len, datatype }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first element.
    pub fn as_ptr(&self) -> *const c_void {
        self.ptr
    }

    /// The address of the first element, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut c_void {
        self.ptr
    }

    /// A shared view for a shorter time.
    pub fn reborrow(&self) -> DynBuffer<'_> {
        DynBuffer { ptr: self.ptr, len: self.len, datatype: self.datatype }
    }

    /// A mutable view for a shorter time.
    pub fn reborrow_mut(&mut self) -> DynBufferMut<'_> {
        DynBufferMut { ptr: self.ptr, len: self.len, datatype: self.datatype }
    }

    /// Gives up write access.
    pub fn downgrade(self) -> DynBuffer<'a> {
        DynBuffer { ptr: self.ptr, len: self.len, datatype: self.datatype }
    }
}

/// A buffer seen through an explicit count and datatype.
pub struct View<'d, 'b, D, B: ?Sized>
where
    D: Datatype,
    B: Pointer,
{
    datatype: &'d D,
    count: Count,
    buffer: &'b B,
}

impl<'d, 'b, D: 'd + Datatype, B: 'b + Pointer + ?Sized> View<'d, 'b, D, B> {
    /// A view of `count` elements of `datatype` at `buffer`.
    ///
    /// # Safety
    /// The memory at `buffer` must hold what `count` and `datatype` describe.
    pub unsafe fn with_count_and_datatype(buffer: &'b B, count: Count, datatype: &'d D) -> Self {
        View { datatype, count, buffer }
    }
}

// SAFETY: the view's creator promised the three parts agree.
unsafe impl<'d, 'b, D: 'd + Datatype, B: 'b + Pointer + ?Sized> AsDatatype for View<'d, 'b, D, B> {
    type Out = &'d D;
    fn as_datatype(&self) -> &'d D {
        self.datatype
    }
}
// SAFETY: as above.
unsafe impl<'d, 'b, D: 'd + Datatype, B: 'b + Pointer + ?Sized> Collection for View<'d, 'b, D, B> {
    fn count(&self) -> Count {
        self.count
    }
}
// SAFETY: as above.
unsafe impl<'d, 'b, D: 'd + Datatype, B: 'b + Pointer + ?Sized> Pointer for View<'d, 'b, D, B> {
    fn pointer(&self) -> *const c_void {
        self.buffer.pointer()
    }
}
// SAFETY: as above.
unsafe impl<'d, 'b, D: 'd + Datatype, B: 'b + Pointer + ?Sized> Buffer for View<'d, 'b, D, B> {}

/// A mutable buffer seen through an explicit count and datatype.
pub struct MutView<'d, 'b, D, B: ?Sized>
where
    D: Datatype,
    B: PointerMut,
{
    datatype: &'d D,
    count: Count,
    buffer: &'b mut B,
}

impl<'d, 'b, D: 'd + Datatype, B: 'b + PointerMut + ?Sized> MutView<'d, 'b, D, B> {
    /// A view of `count` elements of `datatype` at `buffer`.
    ///
    /// # Safety
    /// The memory at `buffer` must hold what `count` and `datatype` describe.
    pub unsafe fn with_count_and_datatype(buffer: &'b mut B, count: Count, datatype: &'d D) -> Self {
        MutView { datatype, count, buffer }
    }
}

// SAFETY: the view's creator promised the three parts agree.
unsafe impl<'d, 'b, D: 'd + Datatype, B: 'b + PointerMut + ?Sized> AsDatatype for MutView<'d, 'b, D, B> {
    type Out = &'d D;
    fn as_datatype(&self) -> &'d D {
        self.datatype
    }
}
// SAFETY: as above.
unsafe impl<'d, 'b, D: 'd + Datatype, B: 'b + PointerMut + ?Sized> Collection for MutView<'d, 'b, D, B> {
    fn count(&self) -> Count {
        self.count
    }
}
// SAFETY: as above.
unsafe impl<'d, 'b, D: 'd + Datatype, B: 'b + PointerMut + ?Sized> PointerMut for MutView<'d, 'b, D, B> {
    fn pointer_mut(&mut self) -> *mut c_void {
        self.buffer.pointer_mut()
    }
}
// SAFETY: as above.
unsafe impl<'d, 'b, D: 'd + Datatype, B: 'b + PointerMut + ?Sized> BufferMut for MutView<'d, 'b, D, B> {}

/// Counts and displacements (in elements) of the parts of a buffer, one per rank.
pub trait Partitioned {
    /// Elements per part.
    fn counts(&self) -> &[Count];
    /// Where each part starts, in elements.
    fn displs(&self) -> &[Count];
}

/// A readable partitioned buffer.
pub trait PartitionedBuffer: Partitioned + Pointer + AsDatatype {}
/// A writable partitioned buffer.
pub trait PartitionedBufferMut: Partitioned + PointerMut + AsDatatype {}

/// A buffer split into parts (for the `varcount` collectives).
pub struct Partition<'b, B: ?Sized, C, D> {
    buf: &'b B,
    counts: C,
    displs: D,
}

impl<'b, B: 'b + Buffer + ?Sized, C: Borrow<[Count]>, D: Borrow<[Count]>> Partition<'b, B, C, D> {
    /// Parts of `buf` with these counts and displacements.
    pub fn new(buf: &'b B, counts: C, displs: D) -> Self {
        check_partition(buf.count(), counts.borrow(), displs.borrow());
        Partition { buf, counts, displs }
    }
}

fn check_partition(len: Count, counts: &[Count], displs: &[Count]) {
    assert!(counts.len() == displs.len(), "mpi: Partition: {} counts but {} displacements", counts.len(), displs.len());
    for (&c, &d) in counts.iter().zip(displs) {
        assert!(
            c >= 0 && d >= 0 && i64::from(c) + i64::from(d) <= i64::from(len),
            "mpi: Partition: part {d}+{c} outside a buffer of {len}"
        );
    }
}

// SAFETY: the partition's buffer describes its own memory.
unsafe impl<'b, B: 'b + AsDatatype + ?Sized, C, D> AsDatatype for Partition<'b, B, C, D> {
    type Out = B::Out;
    fn as_datatype(&self) -> B::Out {
        self.buf.as_datatype()
    }
}
// SAFETY: as above.
unsafe impl<'b, B: 'b + Pointer + ?Sized, C, D> Pointer for Partition<'b, B, C, D> {
    fn pointer(&self) -> *const c_void {
        self.buf.pointer()
    }
}
impl<'b, B: 'b + ?Sized, C: Borrow<[Count]>, D: Borrow<[Count]>> Partitioned for Partition<'b, B, C, D> {
    fn counts(&self) -> &[Count] {
        self.counts.borrow()
    }
    fn displs(&self) -> &[Count] {
        self.displs.borrow()
    }
}
impl<'b, B: 'b + Pointer + AsDatatype + ?Sized, C: Borrow<[Count]>, D: Borrow<[Count]>> PartitionedBuffer for Partition<'b, B, C, D> {}

/// A mutable buffer split into parts.
pub struct PartitionMut<'b, B: ?Sized, C, D> {
    buf: &'b mut B,
    counts: C,
    displs: D,
}

impl<'b, B: 'b + BufferMut + ?Sized, C: Borrow<[Count]>, D: Borrow<[Count]>> PartitionMut<'b, B, C, D> {
    /// Parts of `buf` with these counts and displacements.
    pub fn new(buf: &'b mut B, counts: C, displs: D) -> Self {
        check_partition(buf.count(), counts.borrow(), displs.borrow());
        PartitionMut { buf, counts, displs }
    }
}

// SAFETY: the partition's buffer describes its own memory.
unsafe impl<'b, B: 'b + AsDatatype + ?Sized, C, D> AsDatatype for PartitionMut<'b, B, C, D> {
    type Out = B::Out;
    fn as_datatype(&self) -> B::Out {
        self.buf.as_datatype()
    }
}
// SAFETY: as above.
unsafe impl<'b, B: 'b + PointerMut + ?Sized, C, D> PointerMut for PartitionMut<'b, B, C, D> {
    fn pointer_mut(&mut self) -> *mut c_void {
        self.buf.pointer_mut()
    }
}
impl<'b, B: 'b + ?Sized, C: Borrow<[Count]>, D: Borrow<[Count]>> Partitioned for PartitionMut<'b, B, C, D> {
    fn counts(&self) -> &[Count] {
        self.counts.borrow()
    }
    fn displs(&self) -> &[Count] {
        self.displs.borrow()
    }
}
impl<'b, B: 'b + PointerMut + AsDatatype + ?Sized, C: Borrow<[Count]>, D: Borrow<[Count]>> PartitionedBufferMut
    for PartitionMut<'b, B, C, D>
{
}

/// The address of a value (`MPI_Get_address`).
pub fn address_of<T>(x: &T) -> Address {
    x as *const T as Address
}

/// Used by `#[derive(Equivalence)]`.
#[doc(hidden)]
pub mod internal {
    use super::{UncommittedDatatype, UncommittedDatatypeRef};

    /// A reference to any datatype value.
    pub fn uref<D: UncommittedDatatype>(d: &D) -> UncommittedDatatypeRef<'_> {
        UncommittedDatatypeRef { desc: d.type_desc() }
    }

    /// Panics unless the universe is initialized, not finalized, and this thread may build
    /// datatypes (the main thread, or any thread under `Threading::Multiple`).
    pub fn check_derive_equivalence_universe_state(type_name: &str) {
        crate::state::check_datatype_thread(type_name);
    }
}

/// Packing and unpacking between user memory and a dense byte stream.
pub(crate) mod pack {
    use super::TypeDesc;

    /// Copies `count` elements at `base` into `out` in packed order.
    ///
    /// # Safety
    /// `base` must point at `count` elements described by `d`, valid for reads.
    pub(crate) unsafe fn pack_into(base: *const u8, count: usize, d: &TypeDesc, out: &mut [u8]) {
        // SAFETY: forwarded (tmpi's `TypeMap::pack_into` has the same contract).
        unsafe { d.pack_into(base, count, out) }
    }

    /// The packed bytes of `count` elements at `base`.
    ///
    /// # Safety
    /// As [`pack_into`].
    pub(crate) unsafe fn pack(base: *const u8, count: usize, d: &TypeDesc) -> Vec<u8> {
        let mut out = vec![0u8; count * d.size()];
        // SAFETY: forwarded.
        unsafe { pack_into(base, count, d, &mut out) };
        out
    }

    /// Panics (naming `call`) when a `bool` position of `packed` holds neither 0 nor 1.
    pub(crate) fn check_bools(packed: &[u8], d: &TypeDesc, call: &str) {
        if let Err(tmpi::Error::InvalidValue { byte, .. }) = d.check_bools(packed, 0) {
            panic!("mpi: {call}: received byte {byte:#04x} for a bool (only 0 and 1 are valid); nothing was written");
        }
    }

    /// Writes the packed elements of `packed` to `count` elements at `base` (whole elements
    /// only; a trailing partial element is dropped).
    ///
    /// # Safety
    /// `base` must point at `count` elements described by `d`, valid for writes.
    pub(crate) unsafe fn unpack(packed: &[u8], base: *mut u8, count: usize, d: &TypeDesc, call: &str) {
        check_bools(packed, d, call);
        let n = packed.len().checked_div(d.size()).unwrap_or(0).min(count);
        // SAFETY: the caller promises the first `count` elements are writable; `packed` holds
        // at least `n * size` bytes and its bools were checked above.
        unsafe { d.unpack_from(packed, base, n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Size, lower and upper bound, runs, bool positions, primitive.
    type Shape = (usize, isize, isize, Vec<(isize, usize)>, Vec<usize>, Option<Prim>);

    fn shape(d: &TypeDesc) -> Shape {
        (d.size(), d.lb(), d.ub(), d.runs().to_vec(), d.bools().to_vec(), d.prim)
    }

    /// Type maps of the constructors: size, bounds, byte runs (merged when adjacent), bool
    /// positions in the packed element, the common primitive.
    #[test]
    fn type_maps() {
        let i32t = i32::equivalent_datatype();
        let cases: Vec<(&str, UserDatatype, Shape)> = vec![
            ("contiguous(3, i32)", UserDatatype::contiguous(3, &i32t), (12, 0, 12, vec![(0, 12)], vec![], Some(Prim::I32))),
            ("vector(2, 2, 3, i32)", UserDatatype::vector(2, 2, 3, &i32t), (16, 0, 20, vec![(0, 8), (12, 8)], vec![], Some(Prim::I32))),
            (
                "indexed([1, 2], [3, 0], i32)",
                UserDatatype::indexed(&[1, 2], &[3, 0], &i32t),
                (12, 0, 16, vec![(12, 4), (0, 8)], vec![], Some(Prim::I32)),
            ),
            (
                "structured(bool@0, f64@8)",
                UserDatatype::structured(&[1, 1], &[0, 8], &[bool::equivalent_datatype(), f64::equivalent_datatype()]),
                (9, 0, 16, vec![(0, 1), (8, 8)], vec![0], None),
            ),
            (
                "structured(u16@8, bool@0): packed in map order",
                UserDatatype::structured(&[1, 1], &[8, 0], &[u16::equivalent_datatype(), bool::equivalent_datatype()]),
                (3, 0, 10, vec![(8, 2), (0, 1)], vec![2], None),
            ),
            ("contiguous(0, i32)", UserDatatype::contiguous(0, &i32t), (0, 0, 0, vec![], vec![], None)),
        ];
        for (what, t, want) in cases {
            assert_eq!(shape(t.type_desc()), want, "{what}");
        }
    }

    /// Dense types go to tmpi as they are; types with gaps or bools do not receive in place.
    #[test]
    fn dense_and_direct() {
        let i32t = i32::equivalent_datatype();
        assert!(i32t.type_desc().is_dense() && i32t.type_desc().direct_recv());
        assert!(UserDatatype::contiguous(4, &i32t).type_desc().is_dense());
        assert!(!UserDatatype::vector(2, 1, 2, &i32t).type_desc().is_dense());
        let b = bool::equivalent_datatype();
        assert!(b.type_desc().is_dense() && !b.type_desc().direct_recv());
    }

    /// Pack then unpack restores the runs and leaves the gaps alone; a bad bool is refused
    /// before anything is written.
    #[test]
    fn pack_unpack_and_bool_check() {
        let t = UserDatatype::vector(2, 1, 2, &i32::equivalent_datatype());
        let src = [1i32, -1, 2, 3, -1, 4, -1];
        // SAFETY: two elements of `t` (extent 12 bytes, data at 0 and 8) lie within `src`.
        let packed = unsafe { pack::pack(src.as_ptr() as *const u8, 2, t.type_desc()) };
        assert_eq!(packed.len(), 16);
        let mut dst = [9i32; 7];
        // SAFETY: as above, for `dst`.
        unsafe { pack::unpack(&packed, dst.as_mut_ptr() as *mut u8, 2, t.type_desc(), "test") };
        assert_eq!(dst, [1, 9, 2, 3, 9, 4, 9]);
        let bad = std::panic::catch_unwind(|| pack::check_bools(&[1, 0, 2], bool::equivalent_datatype().type_desc(), "test"));
        assert!(bad.is_err());
        pack::check_bools(&[1, 0, 1], bool::equivalent_datatype().type_desc(), "test");
    }
}
