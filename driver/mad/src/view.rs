//! The `view!` macro: zero-copy accessors over a buffer (smoltcp's `Packet<T>`). A message
//! view wraps a whole 256-byte MAD with `BASE` = 24, so the offsets in its field list are
//! the IBA table offsets (bytes from the start of the CM data); a path view wraps the bytes
//! of one path inside a message with `BASE` = 0.

macro_rules! view {
    (
        $(#[$meta:meta])*
        pub struct $name:ident [base $base:expr, len $len:expr] {
            $( $(#[$fmeta:meta])* $get:ident / $set:ident : $kind:ident ( $($arg:expr),* ); )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            const BASE: usize = $base;
            /// Bytes the view covers from the start of its buffer.
            pub const BUFFER_LEN: usize = $base + $len;

            /// Wraps a buffer without checking its length; accessors on a short buffer
            /// read zeros and writes are dropped, they never panic.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer of at least [`Self::BUFFER_LEN`] bytes.
            pub fn new_checked(buffer: T) -> Result<Self, crate::Error> {
                let len = buffer.as_ref().len();
                if len < Self::BUFFER_LEN {
                    return Err(crate::Error::Truncated { len });
                }
                Ok(Self { buffer })
            }

            /// The wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            $( crate::view::view!(@get $(#[$fmeta])* $get $kind ($($arg),*)); )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            $( crate::view::view!(@set $set $kind ($($arg),*)); )*
        }
    };

    (@get $(#[$m:meta])* $get:ident u8 ($at:expr)) => {
        $(#[$m])* #[inline]
        pub fn $get(&self) -> u8 { crate::field::u8_at(self.buffer.as_ref(), Self::BASE + $at) }
    };
    (@set $set:ident u8 ($at:expr)) => {
        #[doc = concat!("Sets the field read by `", stringify!($set), "`'s getter.")]
        #[inline]
        pub fn $set(&mut self, value: u8) { crate::field::set_u8(self.buffer.as_mut(), Self::BASE + $at, value) }
    };
    (@get $(#[$m:meta])* $get:ident u16 ($at:expr)) => {
        $(#[$m])* #[inline]
        pub fn $get(&self) -> u16 { crate::field::u16_at(self.buffer.as_ref(), Self::BASE + $at) }
    };
    (@set $set:ident u16 ($at:expr)) => {
        #[doc = concat!("Sets the field read by `", stringify!($set), "`'s getter.")]
        #[inline]
        pub fn $set(&mut self, value: u16) { crate::field::set_u16(self.buffer.as_mut(), Self::BASE + $at, value) }
    };
    (@get $(#[$m:meta])* $get:ident u24 ($at:expr)) => {
        $(#[$m])* #[inline]
        pub fn $get(&self) -> u32 { crate::field::u24_at(self.buffer.as_ref(), Self::BASE + $at) }
    };
    (@set $set:ident u24 ($at:expr)) => {
        #[doc = concat!("Sets the 24-bit field read by `", stringify!($set), "`'s getter (low 24 bits of the value).")]
        #[inline]
        pub fn $set(&mut self, value: u32) { crate::field::set_u24(self.buffer.as_mut(), Self::BASE + $at, value) }
    };
    (@get $(#[$m:meta])* $get:ident u32 ($at:expr)) => {
        $(#[$m])* #[inline]
        pub fn $get(&self) -> u32 { crate::field::u32_at(self.buffer.as_ref(), Self::BASE + $at) }
    };
    (@set $set:ident u32 ($at:expr)) => {
        #[doc = concat!("Sets the field read by `", stringify!($set), "`'s getter.")]
        #[inline]
        pub fn $set(&mut self, value: u32) { crate::field::set_u32(self.buffer.as_mut(), Self::BASE + $at, value) }
    };
    (@get $(#[$m:meta])* $get:ident u64 ($at:expr)) => {
        $(#[$m])* #[inline]
        pub fn $get(&self) -> u64 { crate::field::u64_at(self.buffer.as_ref(), Self::BASE + $at) }
    };
    (@set $set:ident u64 ($at:expr)) => {
        #[doc = concat!("Sets the field read by `", stringify!($set), "`'s getter.")]
        #[inline]
        pub fn $set(&mut self, value: u64) { crate::field::set_u64(self.buffer.as_mut(), Self::BASE + $at, value) }
    };
    (@get $(#[$m:meta])* $get:ident bits ($at:expr, $shift:expr, $width:expr)) => {
        $(#[$m])* #[inline]
        pub fn $get(&self) -> u8 { crate::field::bits_at(self.buffer.as_ref(), Self::BASE + $at, $shift, $width) }
    };
    (@set $set:ident bits ($at:expr, $shift:expr, $width:expr)) => {
        #[doc = concat!("Sets the bit field read by `", stringify!($set), "`'s getter (other bits of the byte kept).")]
        #[inline]
        pub fn $set(&mut self, value: u8) { crate::field::set_bits(self.buffer.as_mut(), Self::BASE + $at, $shift, $width, value) }
    };
    (@get $(#[$m:meta])* $get:ident flow ($at:expr)) => {
        $(#[$m])* #[inline]
        pub fn $get(&self) -> u32 { crate::field::u32_at(self.buffer.as_ref(), Self::BASE + $at) >> 12 }
    };
    (@set $set:ident flow ($at:expr)) => {
        #[doc = concat!("Sets the 20-bit flow label read by `", stringify!($set), "`'s getter (bits 31..12 of the word).")]
        #[inline]
        pub fn $set(&mut self, value: u32) {
            let buf = self.buffer.as_mut();
            let low = crate::field::u32_at(buf, Self::BASE + $at) & 0xfff;
            crate::field::set_u32(buf, Self::BASE + $at, (value << 12) | low)
        }
    };
    (@get $(#[$m:meta])* $get:ident gid ($at:expr)) => {
        $(#[$m])* #[inline]
        pub fn $get(&self) -> crate::Gid { crate::field::get(self.buffer.as_ref(), Self::BASE + $at) }
    };
    (@set $set:ident gid ($at:expr)) => {
        #[doc = concat!("Sets the GID read by `", stringify!($set), "`'s getter.")]
        #[inline]
        pub fn $set(&mut self, value: crate::Gid) { crate::field::put(self.buffer.as_mut(), Self::BASE + $at, value) }
    };
    (@get $(#[$m:meta])* $get:ident bytes ($at:expr, $len:expr)) => {
        $(#[$m])* #[inline]
        pub fn $get(&self) -> &[u8] { crate::field::bytes(self.buffer.as_ref(), Self::BASE + $at, $len) }
    };
    (@set $set:ident bytes ($at:expr, $len:expr)) => {
        #[doc = concat!("Copies up to ", stringify!($len), " bytes to the field read by `", stringify!($set), "`'s getter; the rest of the field is left as it is.")]
        #[inline]
        pub fn $set(&mut self, data: &[u8]) {
            let n = data.len().min($len);
            crate::field::set_bytes(self.buffer.as_mut(), Self::BASE + $at, data.get(..n).unwrap_or(&[]))
        }
    };
}

pub(crate) use view;
