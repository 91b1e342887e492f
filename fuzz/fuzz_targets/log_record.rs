//! Recovery of the Raft log file: the bytes are the `log.bin` a node finds when it restarts.
//! Replay must return the length of the whole records or a clean error: never panic, never
//! allocate what the bytes present cannot hold. A replayed prefix must replay again to the same
//! length (the node cuts the file there and reopens it later).
//!
//! Input: `[mode][bytes...]`. Mode bit 0 clear: the bytes are the file as they are. Set: the
//! bytes are cut into payloads (`[len][payload]` each) and framed with valid lengths and
//! checksums, as the writer frames records, so the fuzzer reaches the record decoder without
//! having to guess CRC-32C; mode bit 1 then damages the last record's tail.
#![no_main]
use bucketd::testing::replay_len;

use libfuzzer_sys::fuzz_target;

/// CRC-32C (Castagnoli), bitwise: the harness's own, so it checks the library's framing
/// rather than sharing its code.
fn crc32c(parts: &[&[u8]]) -> u32 {
    let mut crc = !0u32;
    for part in parts {
        for &b in *part {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
            }
        }
    }
    !crc
}

fn frame(payload: &[u8], out: &mut Vec<u8>) {
    let len = (payload.len() as u32).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&crc32c(&[&len]).to_le_bytes());
    out.extend_from_slice(&crc32c(&[&len, payload]).to_le_bytes());
    out.extend_from_slice(payload);
}

fn check(file: &[u8]) {
    if let Ok(valid) = replay_len(file) {
        let valid = usize::try_from(valid).expect("fits");
        assert!(valid <= file.len(), "valid length {valid} past the end");
        assert_eq!(
            replay_len(&file[..valid]).ok(),
            Some(valid as u64),
            "the recovered prefix does not replay to itself"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        check(rest);
        return;
    }
    let mut file = Vec::new();
    let mut rest = rest;
    while let Some((&len, tail)) = rest.split_first() {
        let n = usize::from(len).min(tail.len());
        let (payload, tail) = tail.split_at(n);
        frame(payload, &mut file);
        rest = tail;
    }
    if mode & 2 == 2 && !file.is_empty() {
        // A crash mid-write: the last record cut short, or its end overwritten with zeros.
        let keep = file.len() - usize::from(mode >> 2).min(file.len());
        if mode & 0x80 == 0 {
            file.truncate(keep);
        } else {
            file[keep..].fill(0);
        }
    }
    check(&file);
});
