//! Big-endian field access inside a MAD buffer.
//!
//! IBA numbers bits MSB first: a field "at byte `b`, bits `[hi:lo]`" is read from the byte's
//! own bit positions. Every accessor here takes a buffer that the caller has already checked
//! to be [`MAD_SIZE`](crate::MAD_SIZE) bytes long, and a constant offset inside it, so the
//! slice operations cannot fail; they still go through `get` so that a wrong constant is a
//! wrong value in a test, never a panic.

#[inline]
pub(crate) fn get<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(src) = buf.get(at..at + N) {
        out.copy_from_slice(src);
    }
    out
}

#[inline]
pub(crate) fn put<const N: usize>(buf: &mut [u8], at: usize, value: [u8; N]) {
    if let Some(dst) = buf.get_mut(at..at + N) {
        dst.copy_from_slice(&value);
    }
}

#[inline]
pub(crate) fn u8_at(buf: &[u8], at: usize) -> u8 {
    buf.get(at).copied().unwrap_or(0)
}

#[inline]
pub(crate) fn set_u8(buf: &mut [u8], at: usize, value: u8) {
    if let Some(b) = buf.get_mut(at) {
        *b = value;
    }
}

#[inline]
pub(crate) fn u16_at(buf: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(get(buf, at))
}

#[inline]
pub(crate) fn set_u16(buf: &mut [u8], at: usize, value: u16) {
    put(buf, at, value.to_be_bytes());
}

#[inline]
pub(crate) fn u32_at(buf: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(get(buf, at))
}

#[inline]
pub(crate) fn set_u32(buf: &mut [u8], at: usize, value: u32) {
    put(buf, at, value.to_be_bytes());
}

#[inline]
pub(crate) fn u64_at(buf: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(get(buf, at))
}

#[inline]
pub(crate) fn set_u64(buf: &mut [u8], at: usize, value: u64) {
    put(buf, at, value.to_be_bytes());
}

/// A 24-bit field in the top three bytes of the big-endian word at `at` (QPN, EECN, PSN).
#[inline]
pub(crate) fn u24_at(buf: &[u8], at: usize) -> u32 {
    let [a, b, c] = get::<3>(buf, at);
    u32::from_be_bytes([0, a, b, c])
}

/// Writes the low 24 bits of `value` to the top three bytes of the word at `at`; the fourth
/// byte is not touched (it holds another field or reserved bits).
#[inline]
pub(crate) fn set_u24(buf: &mut [u8], at: usize, value: u32) {
    let [_, a, b, c] = value.to_be_bytes();
    put(buf, at, [a, b, c]);
}

/// Bits `[shift + width - 1 : shift]` of the byte at `at`.
#[inline]
pub(crate) fn bits_at(buf: &[u8], at: usize, shift: u32, width: u32) -> u8 {
    (u8_at(buf, at) >> shift) & mask(width)
}

/// Replaces bits `[shift + width - 1 : shift]` of the byte at `at`, keeping the others.
#[inline]
pub(crate) fn set_bits(buf: &mut [u8], at: usize, shift: u32, width: u32, value: u8) {
    let m = mask(width) << shift;
    let old = u8_at(buf, at);
    set_u8(buf, at, (old & !m) | ((value << shift) & m));
}

#[inline]
const fn mask(width: u32) -> u8 {
    if width >= 8 { 0xff } else { (1u8 << width) - 1 }
}

/// The byte range `[at, at + len)` of the buffer, or an empty slice if it does not fit.
#[inline]
pub(crate) fn bytes(buf: &[u8], at: usize, len: usize) -> &[u8] {
    buf.get(at..at + len).unwrap_or(&[])
}

/// Copies `data` to `at`; the caller has checked `data.len()` against the field's size.
#[inline]
pub(crate) fn set_bytes(buf: &mut [u8], at: usize, data: &[u8]) {
    if let Some(dst) = buf.get_mut(at..at + data.len()) {
        dst.copy_from_slice(data);
    }
}
