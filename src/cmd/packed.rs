//! Byte strings decoded from a Raft log entry, packed into a few buffers per entry instead of
//! one allocation each.
//!
//! A follower decodes every entry its leader sends and keeps it in memory until a snapshot
//! covers it. Decoded one by one, each command's key would be an allocation of its own:
//! millions of small blocks, all freed together when the log is trimmed, leaving the
//! allocator's heap in pieces and every later allocation slower. While `commands` decodes an entry's
//! commands, the key and value fields of `KeyCmd` (which name `bytes`, `list` and `optional`
//! in `deserialize_with`) are copied end to end into shared buffers sized for the entry: each
//! string is then a reference into one, and a buffer is freed when the entry's last command
//! goes. A buffer holds one entry's strings only, so it lives exactly as long as that entry,
//! and the memory an entry keeps is about what its strings weigh (at most one buffer's unused
//! tail more).
//!
//! Outside an entry (a batch forwarded to a leader, say), and for a string longer than
//! `PACK_MAX`, a string is copied into an allocation of its own, as `Bytes` itself decodes.
//! Only decoding changes: the encoded bytes are the same either way.
//!
//! Where an entry's encoding is at hand as `Bytes` (a follower's copy of what its leader sent,
//! an entry read back after its commands were dropped), `slicing` decodes the commands with
//! every string a view into that encoding instead, which lives exactly as long as the entry.

use super::keyed::KeyCmd;
use bytes::{Bytes, BytesMut};
use serde::Deserializer;
use serde::de::{self, SeqAccess, Visitor};
use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

/// Longer strings get an allocation of their own: sharing saves nothing for them, and one
/// would pin its neighbours' buffer.
const PACK_MAX: usize = 1024;

/// Room made per command of the entry being decoded, for its strings (a rate-limit key is
/// typically 10 to 40 bytes); a buffer that fills up is followed by another of the same size.
const ROOM_PER_COMMAND: usize = 32;

/// Bounds of one buffer's size.
const BUF_MIN: usize = 256;
const BUF_MAX: usize = 16 << 10;

struct Arena {
    buf: BytesMut,
    /// Size of the next buffer.
    next: usize,
}

/// Where the strings decoded on this thread go.
enum Mode {
    /// Into shared buffers (see the module's documentation).
    Pack(Arena),
    /// Views into these bytes, which are being decoded.
    Slice(Bytes),
}

thread_local! {
    /// How strings decoded on this thread are kept, while `packing` or `slicing` runs.
    static MODE: RefCell<Option<Mode>> = const { RefCell::new(None) };
}

/// Runs `decode` with strings kept as `mode` says; the mode it replaced comes back however
/// `decode` ends. Nested calls each have their own.
fn in_mode<R>(mode: Mode, decode: impl FnOnce() -> R) -> R {
    let outer = MODE.with_borrow_mut(|m| m.replace(mode));
    struct Restore(Option<Mode>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            MODE.with_borrow_mut(|m| *m = outer);
        }
    }
    let _restore = Restore(outer);
    decode()
}

/// Runs `decode` with the strings it decodes packed into buffers of their own, sized for
/// about `commands` commands.
fn packing<R>(commands: usize, decode: impl FnOnce() -> R) -> R {
    let next = commands
        .saturating_mul(ROOM_PER_COMMAND)
        .clamp(BUF_MIN, BUF_MAX);
    let arena = Arena {
        buf: BytesMut::new(),
        next,
    };
    in_mode(Mode::Pack(arena), decode)
}

/// Runs `decode` over `src` with every string that lies within `src` kept as a view into it
/// rather than copied.
pub(crate) fn slicing<R>(src: &Bytes, decode: impl FnOnce() -> R) -> R {
    in_mode(Mode::Slice(src.clone()), decode)
}

/// Whether strings being decoded now are views into the bytes decoded.
fn slicing_now() -> bool {
    MODE.with_borrow(|m| matches!(m, Some(Mode::Slice(_))))
}

/// `v` as `Bytes`, kept as the current mode says: a view when it lies within the bytes being
/// sliced, in the current arena when packing and `v` is short, else a copy of its own.
fn store(v: &[u8]) -> Bytes {
    if v.is_empty() {
        return Bytes::new();
    }
    MODE.with_borrow_mut(|m| match m {
        Some(Mode::Slice(src)) => {
            let start = src.as_ptr() as usize;
            let at = v.as_ptr() as usize;
            if at >= start && at - start + v.len() <= src.len() {
                let from = at - start;
                src.slice(from..from + v.len())
            } else {
                Bytes::copy_from_slice(v)
            }
        }
        Some(Mode::Pack(arena)) if v.len() <= PACK_MAX => {
            if arena.buf.capacity() < v.len() {
                arena.buf = BytesMut::with_capacity(arena.next.max(v.len()));
            }
            arena.buf.extend_from_slice(v);
            arena.buf.split().freeze()
        }
        _ => Bytes::copy_from_slice(v),
    })
}

struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Bytes;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Bytes, E> {
        Ok(store(v))
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
        Ok(Bytes::from(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Bytes, E> {
        Ok(store(v.as_bytes()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Bytes, E> {
        Ok(Bytes::from(v))
    }

    /// Self-describing formats may write bytes as a list of numbers.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(PACK_MAX));
        while let Some(b) = seq.next_element::<u8>()? {
            v.push(b);
        }
        Ok(Bytes::from(v))
    }
}

/// A log entry's commands (`deserialize_with` of `Proposal::cmds`), their strings packed in
/// buffers sized by the number of commands.
pub(crate) fn commands<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<Vec<KeyCmd>>, D::Error> {
    struct Commands;
    impl<'de> Visitor<'de> for Commands {
        type Value = Vec<KeyCmd>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of commands")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Vec<KeyCmd>, A::Error> {
            let n = seq.size_hint().unwrap_or(0);
            // The hint comes from the input: capped, so a forged count allocates little.
            let collect = |mut seq: A| {
                let mut cmds = Vec::with_capacity(n.min(4096));
                while let Some(c) = seq.next_element()? {
                    cmds.push(c);
                }
                Ok(cmds)
            };
            if slicing_now() {
                collect(seq)
            } else {
                packing(n, || collect(seq))
            }
        }
    }
    d.deserialize_seq(Commands).map(Arc::new)
}

/// One string (`deserialize_with` of a `Bytes` field).
pub(crate) fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
    d.deserialize_bytes(BytesVisitor)
}

/// A `Bytes` that decodes through the arena, for lists and options of strings.
struct Packed(Bytes);

impl<'de> de::Deserialize<'de> for Packed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Packed, D::Error> {
        bytes(d).map(Packed)
    }
}

/// A list of strings (`deserialize_with` of a `Vec<Bytes>` field).
pub(crate) fn list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Bytes>, D::Error> {
    // serde caps the length hint it reserves for; unwrapping collects in place.
    <Vec<Packed> as de::Deserialize>::deserialize(d).map(|v| v.into_iter().map(|p| p.0).collect())
}

/// An optional string (`deserialize_with` of an `Option<Bytes>` field).
pub(crate) fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Bytes>, D::Error> {
    <Option<Packed> as de::Deserialize>::deserialize(d).map(|o| o.map(|p| p.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Cmd {
        #[serde(deserialize_with = "bytes")]
        key: Bytes,
        #[serde(deserialize_with = "list")]
        keys: Vec<Bytes>,
        #[serde(deserialize_with = "optional")]
        pattern: Option<Bytes>,
    }

    fn cmd(i: usize) -> Cmd {
        Cmd {
            key: Bytes::from(format!("bucket:{{tag}}:{i}")),
            keys: vec![Bytes::from(format!("a{i}")), Bytes::new()],
            pattern: i.is_multiple_of(2).then(|| Bytes::from_static(b"p*")),
        }
    }

    fn decode(bytes: &[u8]) -> Vec<Cmd> {
        bincode::serde::decode_from_slice(bytes, bincode::config::standard())
            .map(|(v, _)| v)
            .unwrap()
    }

    #[test]
    fn packed_strings_decode_to_the_same_values_and_share_buffers() {
        let cmds: Vec<Cmd> = (0..100).map(cmd).collect();
        let enc = bincode::serde::encode_to_vec(&cmds, bincode::config::standard()).unwrap();
        let plain = decode(&enc);
        let packed = packing(cmds.len(), || decode(&enc));
        assert_eq!(plain, cmds);
        assert_eq!(packed, cmds);
        // Packed strings lie end to end, in decoding order, in a few buffers; plain ones each
        // have their own allocation.
        let adjacent = |v: &[Cmd]| {
            let strings: Vec<&Bytes> = v
                .iter()
                .flat_map(|c| [Some(&c.key), Some(&c.keys[0]), c.pattern.as_ref()])
                .flatten()
                .collect();
            let pairs = strings
                .windows(2)
                .filter(|w| w[0].as_ptr().wrapping_add(w[0].len()) == w[1].as_ptr())
                .count();
            (pairs, strings.len() - 1)
        };
        let (packed_pairs, pairs) = adjacent(&packed);
        assert!(packed_pairs * 10 > pairs * 9, "{packed_pairs} of {pairs}");
        assert_eq!(adjacent(&plain).0, 0);
    }

    #[test]
    fn a_long_string_gets_its_own_allocation_and_the_arena_ends_with_packing() {
        let long = Cmd {
            key: Bytes::from(vec![7u8; PACK_MAX + 1]),
            keys: vec![],
            pattern: None,
        };
        let enc = bincode::serde::encode_to_vec(&long, bincode::config::standard()).unwrap();
        let got: Cmd = packing(1, || {
            bincode::serde::decode_from_slice(&enc, bincode::config::standard())
                .map(|(v, _)| v)
                .unwrap()
        });
        assert_eq!(got, long);
        assert!(MODE.with_borrow(|m| m.is_none()));
    }
}
