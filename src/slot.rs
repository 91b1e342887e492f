//! Redis Cluster hash slots: CRC16-XMODEM of the key (or of its `{hash tag}`) modulo 16384.

/// Number of hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// CRC16-XMODEM (polynomial 0x1021, initial value 0, no reflection), one entry per leading byte.
/// Built at compile time so the per-request cost is one lookup per key byte.
static TABLE: [u16; 256] = build_table();

const fn build_table() -> [u16; 256] {
    let mut table = [0u16; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = (byte as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[byte] = crc;
        byte += 1;
    }
    table
}

/// CRC16-XMODEM, the checksum Redis Cluster uses for key hashing.
pub fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, &byte| {
        let index = usize::from(crc.to_be_bytes()[0] ^ byte);
        (crc << 8) ^ TABLE[index]
    })
}

/// The part of the key that decides its slot: the bytes between the first `{` and the first `}`
/// after it when there is at least one, otherwise the whole key. This lets clients keep related
/// keys (`{user1000}.following`, `{user1000}.followers`) on one node.
fn hashed_part(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    let Some((_, after)) = key.split_at_checked(open + 1) else {
        return key;
    };
    match after.iter().position(|&b| b == b'}') {
        Some(close) if close > 0 => after.get(..close).unwrap_or(key),
        _ => key,
    }
}

/// The cluster slot (0..16384) that owns `key`.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hashed_part(key)) & (SLOTS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bit-at-a-time CRC16-XMODEM, straight from the definition.
    fn crc16_bitwise(data: &[u8]) -> u16 {
        let mut crc = 0u16;
        for &byte in data {
            crc ^= u16::from(byte) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc
    }

    #[test]
    fn crc16_check_value() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn known_slots() {
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"hello"), 866);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn hash_tags() {
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") & 0x3FFF);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(hashed_part(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hashed_part(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hashed_part(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hashed_part(b"{"), b"{");
        assert_eq!(hashed_part(b"}{"), b"}{");
        assert_eq!(hashed_part(b"a{b"), b"a{b");
        assert_eq!(hashed_part(b"{x}"), b"x");
    }

    proptest! {
        #[test]
        fn table_matches_definition(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(crc16(&data), crc16_bitwise(&data));
            prop_assert!(key_slot(&data) < SLOTS);
        }

        #[test]
        fn tag_decides_slot(tag in "[a-z0-9]{1,8}", a in "[a-z.]{0,6}", b in "[a-z.{]{0,6}") {
            let key = format!("{a}{{{tag}}}{b}");
            prop_assert_eq!(key_slot(key.as_bytes()), key_slot(tag.as_bytes()));
        }
    }
}
