//! The bytes of a send buffer as tmpi sends them (point-to-point, collectives and
//! communicator constructors alike).

use crate::datatype::pack;
use crate::datatype::traits::*;
use crate::uidx;

/// The bytes of a buffer as tmpi sends them: the memory itself when its type is dense, else
/// a packed copy.
pub(crate) fn send_bytes<B: Buffer + ?Sized, R>(buf: &B, f: impl FnOnce(&[u8]) -> R) -> R {
    let dt = buf.as_datatype();
    let d = dt.type_desc();
    let count = uidx(buf.count(), "send");
    let base = buf.pointer() as *const u8;
    if d.is_dense() {
        // SAFETY: `Buffer` promises `count` elements of a dense type: `count * size`
        // initialized bytes at the pointer.
        f(unsafe { std::slice::from_raw_parts(base, count * d.size()) })
    } else {
        // SAFETY: `Buffer` promises `count` readable elements of its datatype.
        f(&unsafe { pack::pack(base, count, d) })
    }
}

/// An owned copy of a buffer's packed bytes (for operations that outlive the borrow).
pub(crate) fn owned_bytes<B: Buffer + ?Sized>(buf: &B) -> Vec<u8> {
    send_bytes(buf, <[u8]>::to_vec)
}
