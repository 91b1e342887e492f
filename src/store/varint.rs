//! Variable-length integers (LEB128, 7 bits a byte, low bits first): the length prefix of each
//! element the packed collections (`list`, `set`) keep in their byte buffers. An element of up
//! to 127 bytes costs one byte of prefix, up to 16 KiB two.

/// Bytes `v` takes.
pub(super) fn len(mut v: usize) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// Appends `v` to `buf`.
pub(super) fn put(buf: &mut Vec<u8>, mut v: usize) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Writes `v` into `out`, which is exactly `len(v)` bytes long.
pub(super) fn write(out: &mut [u8], mut v: usize) {
    for b in out.iter_mut() {
        *b = (v as u8 & 0x7f) | if v >= 0x80 { 0x80 } else { 0 };
        v >>= 7;
    }
}

/// The integer at `at` and the offset just past it; None when `buf` ends inside it or it
/// does not fit a `usize`.
pub(super) fn get(buf: &[u8], at: usize) -> Option<(usize, usize)> {
    let mut v: usize = 0;
    let mut shift = 0u32;
    let mut i = at;
    loop {
        let b = *buf.get(i)?;
        i += 1;
        let part = usize::from(b & 0x7f);
        if shift >= usize::BITS || (part << shift) >> shift != part {
            return None;
        }
        v |= part << shift;
        if b & 0x80 == 0 {
            return Some((v, i));
        }
        shift += 7;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_length_reads_back() {
        for v in [0, 1, 127, 128, 300, 16_383, 16_384, 1 << 40, usize::MAX] {
            let mut buf = vec![9];
            put(&mut buf, v);
            assert_eq!(buf.len(), 1 + len(v));
            assert_eq!(get(&buf, 1), Some((v, buf.len())));
            let mut again = vec![0; len(v)];
            write(&mut again, v);
            assert_eq!(again, buf[1..]);
        }
        assert_eq!(get(&[0x80], 0), None);
        assert_eq!(get(&[0xff; 11], 0), None);
    }
}
