//! Bit-flag types of the fi_mr calls, with the bit values of libfabric's `fabric.h`.
//!
//! Each type keeps whatever bits it is given (like `bitflags`' `from_bits_retain`), so a call
//! can see an unsupported bit and refuse it with the errno the man page names, instead of the
//! bit being silently dropped at construction.

use std::fmt;
use std::ops::{BitAnd, BitOr, BitOrAssign};

macro_rules! flag_type {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$fmeta:meta])* $flag:ident = $value:expr; )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(u64);

        impl $name {
            $( $(#[$fmeta])* pub const $flag: Self = Self($value); )+

            /// Every bit this type names.
            pub const KNOWN: Self = Self(0 $( | $value )+);

            /// No bits set.
            pub const fn empty() -> Self {
                Self(0)
            }

            /// The raw bits.
            pub const fn bits(self) -> u64 {
                self.0
            }

            /// Wraps raw bits, keeping bits this type does not name (calls refuse them).
            pub const fn from_bits_retain(bits: u64) -> Self {
                Self(bits)
            }

            /// Whether no bit is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }

            /// Whether every bit of `other` is set in `self`.
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether `self` and `other` share a bit.
            pub const fn intersects(self, other: Self) -> bool {
                self.0 & other.0 != 0
            }

            /// The bits of `self` that this type does not name.
            pub const fn unknown_bits(self) -> u64 {
                self.0 & !Self::KNOWN.0
            }
        }

        impl BitOr for $name {
            type Output = Self;
            fn bitor(self, rhs: Self) -> Self {
                Self(self.0 | rhs.0)
            }
        }

        impl BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: Self) {
                self.0 |= rhs.0;
            }
        }

        impl BitAnd for $name {
            type Output = Self;
            fn bitand(self, rhs: Self) -> Self {
                Self(self.0 & rhs.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}(", stringify!($name))?;
                let mut first = true;
                $(
                    if self.0 & $value != 0 {
                        if !first {
                            f.write_str(" | ")?;
                        }
                        f.write_str(stringify!($flag))?;
                        first = false;
                    }
                )+
                let unknown = self.unknown_bits();
                if unknown != 0 {
                    if !first {
                        f.write_str(" | ")?;
                    }
                    write!(f, "{unknown:#x}")?;
                }
                f.write_str(")")
            }
        }
    };
}

flag_type! {
    /// The domain's `mr_mode` bits (`FI_MR_*`): what the application agreed to do for the
    /// provider. The values are those of `fabric.h`.
    MrMode {
        /// `FI_MR_BASIC` (deprecated since libfabric 1.5; the value 1 of the old enum): set
        /// alone, it asks for `VIRT_ADDR | ALLOCATED | PROV_KEY`, and it is not cleared.
        BASIC = 1 << 0;
        /// `FI_MR_SCALABLE` (deprecated since libfabric 1.5; the value 2 of the old enum): set
        /// alone, the default behaviour (no mode bit).
        SCALABLE = 1 << 1;
        /// `FI_MR_LOCAL`: local data buffers must be registered and their `desc` passed.
        LOCAL = 1 << 2;
        /// `FI_MR_RAW`: keys must be read with `raw_attr` and mapped at the peer with `map_raw`.
        RAW = 1 << 3;
        /// `FI_MR_VIRT_ADDR`: peers address a region by virtual address, not by 0-based offset.
        VIRT_ADDR = 1 << 4;
        /// `FI_MR_ALLOCATED`: registered ranges must be backed by pages when registered.
        ALLOCATED = 1 << 5;
        /// `FI_MR_PROV_KEY`: the provider chooses keys; `requested_key` is ignored.
        PROV_KEY = 1 << 6;
        /// `FI_MR_MMU_NOTIFY`: the application calls `refresh` when backing pages change.
        MMU_NOTIFY = 1 << 7;
        /// `FI_MR_RMA_EVENT`: regions registered with `FI_RMA_EVENT` start disabled.
        RMA_EVENT = 1 << 8;
        /// `FI_MR_ENDPOINT`: regions belong to endpoints; they start disabled and need one bound.
        ENDPOINT = 1 << 9;
        /// `FI_MR_HMEM`: device buffers must be registered. The model has no device memory and
        /// does not need it: [`super::Domain::open`] clears it (see
        /// [`super::Domain::cleared_mode`]).
        HMEM = 1 << 10;
        /// `FI_MR_COLLECTIVE`: buffers of collective calls must be registered with
        /// `FI_COLLECTIVE`. Nothing here offloads collectives: cleared by
        /// [`super::Domain::open`].
        COLLECTIVE = 1 << 11;
    }
}

flag_type! {
    /// Access rights of a region (`FI_SEND` ... `FI_REMOTE_WRITE`).
    Access {
        /// `FI_COLLECTIVE`: the buffer may be used with collective operations (paired with
        /// `SEND` and/or `RECV`). Accepted and recorded; since no domain of this model keeps
        /// `FI_MR_COLLECTIVE`, no check ever requires it (the relaxed enforcement the man page
        /// permits).
        COLLECTIVE = 1 << 6;
        /// `FI_READ`: result buffer of local RMA reads and atomics.
        READ = 1 << 8;
        /// `FI_WRITE`: source buffer of local RMA writes and atomics.
        WRITE = 1 << 9;
        /// `FI_RECV`: buffer of receive operations.
        RECV = 1 << 10;
        /// `FI_SEND`: buffer of send operations.
        SEND = 1 << 11;
        /// `FI_REMOTE_READ`: peers may RDMA-read from the region.
        REMOTE_READ = 1 << 12;
        /// `FI_REMOTE_WRITE`: peers may RDMA-write (or apply atomics) to the region.
        REMOTE_WRITE = 1 << 13;
    }
}

flag_type! {
    /// Flags of the registration calls (`flags` argument of `fi_mr_reg*`).
    RegFlags {
        /// `FI_RMA_EVENT`: the region will be bound to a completion counter.
        RMA_EVENT = 1 << 56;
        /// `FI_HMEM_DEVICE_ONLY`: device-only memory. Named so the registration calls can
        /// answer `-FI_ENOSYS` (no device memory here) rather than `-FI_EBADFLAGS`.
        HMEM_DEVICE_ONLY = 1 << 46;
        /// `FI_HMEM_HOST_ALLOC`: host memory allocated through a device API; `-FI_ENOSYS`.
        HMEM_HOST_ALLOC = 1 << 45;
        /// `FI_MR_DMABUF`: the region is a DMA-buf (`fi_mr_dmabuf`); `-FI_ENOSYS`.
        DMABUF = 1 << 40;
    }
}

flag_type! {
    /// Flags of `fi_mr_bind` with a counter: which events the counter counts.
    BindFlags {
        /// `FI_REMOTE_WRITE`: count every remote write or atomic that modifies the region.
        REMOTE_WRITE = 1 << 13;
    }
}

/// `FI_RMA_PMEM` (`1 << 49`): a registration flag libfabric defines that this model does not
/// support; passing it yields `EBADFLAGS`.
pub const FI_RMA_PMEM: u64 = 1 << 49;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_fabric_h() {
        assert_eq!(MrMode::LOCAL.bits(), 4);
        assert_eq!(MrMode::ENDPOINT.bits(), 512);
        assert_eq!(Access::REMOTE_WRITE.bits(), 0x2000);
        assert_eq!(RegFlags::RMA_EVENT.bits(), 1 << 56);
    }

    #[test]
    fn ops_and_debug() {
        let a = Access::REMOTE_READ | Access::SEND;
        assert!(a.contains(Access::SEND));
        assert!(!a.contains(Access::REMOTE_WRITE));
        assert!(a.intersects(Access::REMOTE_READ | Access::RECV));
        assert_eq!(a.unknown_bits(), 0);
        let b = Access::from_bits_retain(1 | Access::READ.bits());
        assert_eq!(b.unknown_bits(), 1);
        assert_eq!(format!("{b:?}"), "Access(READ | 0x1)");
        assert_eq!(format!("{:?}", MrMode::empty()), "MrMode()");
    }
}
