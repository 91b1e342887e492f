//! Decoding a log entry from its bytes, with the strings of its commands as views into them.
//!
//! A follower decodes every entry its leader sends it. Through serde, each command of an entry
//! passes bincode's generic enum and struct visitors, and each string a thread-local lookup of
//! where it is kept (see `cmd::packed`). The common case is read here directly off the bytes
//! instead, in about half the time (`cargo bench --bench hot_path -- replication`): a normal
//! entry whose commands are limit checks, counters and reads. Any other command of such an entry is
//! decoded through serde where it starts; any other entry, or any byte this reader does not
//! expect (including an integer not in bincode's shortest form), and the whole entry is left
//! to serde, which decodes it or says what is wrong with it. So what this reader accepts is a
//! subset of what serde accepts, and decodes to the same value.

use super::typ::{Entry, Origin, Proposal, TypeConfig};
use crate::cmd::KeyCmd;
use crate::limiter::CellArgs;
use crate::limiter::{Algorithm, Rule};
use bincode::error::DecodeError;
use bytes::Bytes;
use openraft::entry::RaftEntry;
use openraft::vote::RaftLeaderIdExt;

/// Variant indexes of the commands read directly (their order in `KeyCmd`, which never
/// changes: see its documentation).
const GET: u8 = 0;
const INCR_BY: u8 = 2;
const THROTTLE: u8 = 9;
const CHECK: u8 = 10;
/// `EntryPayload::Normal`.
const NORMAL: u8 = 1;

/// Decodes the entry that starts at `from` in `src`, with its strings as views into `src`;
/// also gives the number of bytes it took.
pub(crate) fn decode_entry(src: &Bytes, from: usize) -> Result<(Entry, usize), DecodeError> {
    // Strings decoded by serde, a whole entry's or one command's, are views into `src` too:
    // the mode that says so is set once for the entry, not once per command.
    crate::cmd::slicing(src, || match Reader::new(src, from).entry() {
        Some(done) => Ok(done),
        None => serde_at(src, from),
    })
}

/// What serde decodes at `from` in `src`, and the bytes it took.
fn serde_at<T: serde::de::DeserializeOwned>(
    src: &Bytes,
    from: usize,
) -> Result<(T, usize), DecodeError> {
    let here = src.get(from..).unwrap_or_default();
    let (value, used) = crate::cluster::decode_bounded(here)?;
    if used > here.len() {
        return Err(DecodeError::UnexpectedEnd {
            additional: used - here.len(),
        });
    }
    Ok((value, used))
}

struct Reader<'a> {
    src: &'a Bytes,
    start: usize,
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(src: &'a Bytes, from: usize) -> Self {
        Reader {
            src,
            start: from,
            at: from,
        }
    }

    fn entry(mut self) -> Option<(Entry, usize)> {
        let term = self.u64()?;
        let node = self.u64()?;
        let index = self.u64()?;
        if self.byte()? != NORMAL {
            return None;
        }
        let ts = self.u64()?;
        let origin = match self.byte()? {
            0 => None,
            1 => Some(Origin {
                run: self.u64()?,
                seq: self.u64()?,
            }),
            _ => return None,
        };
        let n = self.len()?;
        // Every command takes at least two bytes, and serde reserves no more than this
        // either: a forged count allocates little.
        let mut cmds = Vec::with_capacity(n.min(self.left() / 2).min(4096));
        for _ in 0..n {
            cmds.push(self.command()?);
        }
        let leader = <TypeConfig as openraft::RaftTypeConfig>::LeaderId::new_committed(term, node);
        let log_id = super::typ::LogId::new(leader, index);
        let entry = Entry::new_normal(log_id, Proposal::new(ts, origin, cmds));
        Some((entry, self.at - self.start))
    }

    fn command(&mut self) -> Option<KeyCmd> {
        let begin = self.at;
        let cmd = match self.byte()? {
            GET => KeyCmd::Get(self.string()?),
            INCR_BY => KeyCmd::IncrBy {
                key: self.string()?,
                delta: self.i64()?,
            },
            THROTTLE => KeyCmd::Throttle {
                key: self.string()?,
                args: CellArgs {
                    max_burst: self.i64()?,
                    count: self.i64()?,
                    period_s: self.i64()?,
                    quantity: self.i64()?,
                },
            },
            CHECK => KeyCmd::Check {
                key: self.string()?,
                rule: self.rule()?,
                cost: self.u64()?,
                peek: self.bool()?,
            },
            _ => {
                self.at = begin;
                return self.through_serde();
            }
        };
        Some(cmd)
    }

    /// One command of a kind not read here, decoded by serde where it starts.
    fn through_serde(&mut self) -> Option<KeyCmd> {
        let (cmd, used) = serde_at::<KeyCmd>(self.src, self.at).ok()?;
        self.at += used;
        Some(cmd)
    }

    fn rule(&mut self) -> Option<Rule> {
        let algorithm = match self.byte()? {
            0 => Algorithm::Gcra,
            1 => Algorithm::Sliding,
            2 => Algorithm::Fixed,
            3 => Algorithm::Aligned,
            _ => return None,
        };
        Some(Rule {
            algorithm,
            limit: self.u64()?,
            period_ns: self.u64()?,
            burst: self.u64()?,
        })
    }

    fn left(&self) -> usize {
        self.src.len().saturating_sub(self.at)
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.src.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn bool(&mut self) -> Option<bool> {
        match self.byte()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let b = self.src.get(self.at..self.at.checked_add(N)?)?;
        self.at += N;
        b.try_into().ok()
    }

    /// bincode's variable-length integer, in its shortest form only.
    fn u64(&mut self) -> Option<u64> {
        match self.byte()? {
            b @ 0..=250 => Some(u64::from(b)),
            251 => {
                let v = u16::from_le_bytes(self.array()?);
                (v >= 251).then_some(u64::from(v))
            }
            252 => {
                let v = u32::from_le_bytes(self.array()?);
                (v > u32::from(u16::MAX)).then_some(u64::from(v))
            }
            253 => {
                let v = u64::from_le_bytes(self.array()?);
                (v > u64::from(u32::MAX)).then_some(v)
            }
            _ => None,
        }
    }

    /// A zigzag-encoded signed integer.
    fn i64(&mut self) -> Option<i64> {
        let u = self.u64()?;
        Some(((u >> 1) as i64) ^ -((u & 1) as i64))
    }

    fn len(&mut self) -> Option<usize> {
        usize::try_from(self.u64()?).ok()
    }

    /// A byte string, as a view into the source.
    fn string(&mut self) -> Option<Bytes> {
        let n = self.len()?;
        let end = self.at.checked_add(n)?;
        if end > self.src.len() {
            return None;
        }
        let s = if n == 0 {
            Bytes::new()
        } else {
            self.src.slice(self.at..end)
        };
        self.at = end;
        Some(s)
    }
}

/// The entry with its commands: decoded from its encoding if it is held as that alone (their
/// strings are then views into the encoding), as it is otherwise.
pub(crate) fn decoded(entry: Entry) -> std::io::Result<Entry> {
    let openraft::EntryPayload::Normal(p) = &entry.payload else {
        return Ok(entry);
    };
    if !p.bytes_only {
        return Ok(entry);
    }
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    let wire = p
        .wire
        .0
        .as_ref()
        .ok_or_else(|| bad(format!("entry {} lost its encoding", entry.log_id)))?;
    let (mut full, used) =
        decode_entry(wire, 0).map_err(|e| bad(format!("entry {}: {e}", entry.log_id)))?;
    if used != wire.len() || full.log_id != entry.log_id {
        return Err(bad(format!(
            "entry {} does not match its encoding",
            entry.log_id
        )));
    }
    super::typ::set_wire(&mut full, Some(wire.clone()));
    Ok(full)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::{SetCond, SetExpiry};
    use proptest::prelude::*;

    fn encode(e: &Entry) -> Vec<u8> {
        bincode::serde::encode_to_vec(e, bincode::config::standard()).unwrap()
    }

    fn through_serde(src: &Bytes) -> Result<(Entry, usize), DecodeError> {
        crate::cmd::slicing(src, || crate::cluster::decode_bounded(src))
    }

    fn log_id(term: u64, node: u64, index: u64) -> super::super::typ::LogId {
        openraft::testing::log_id::<TypeConfig>(term, node, index)
    }

    fn key(k: &[u8]) -> Bytes {
        Bytes::copy_from_slice(k)
    }

    fn read_directly() -> impl Strategy<Value = KeyCmd> {
        let k = proptest::collection::vec(any::<u8>(), 0..300).prop_map(Bytes::from);
        let alg = prop_oneof![
            Just(Algorithm::Gcra),
            Just(Algorithm::Sliding),
            Just(Algorithm::Fixed),
            Just(Algorithm::Aligned)
        ];
        prop_oneof![
            k.clone().prop_map(KeyCmd::Get),
            (k.clone(), any::<i64>()).prop_map(|(key, delta)| KeyCmd::IncrBy { key, delta }),
            (k.clone(), any::<[i64; 4]>()).prop_map(|(key, a)| KeyCmd::Throttle {
                key,
                args: CellArgs {
                    max_burst: a[0],
                    count: a[1],
                    period_s: a[2],
                    quantity: a[3],
                },
            }),
            (k.clone(), alg, any::<[u64; 4]>(), any::<bool>()).prop_map(
                |(key, algorithm, v, peek)| {
                    KeyCmd::Check {
                        key,
                        rule: Rule {
                            algorithm,
                            limit: v[0],
                            period_ns: v[1],
                            burst: v[2],
                        },
                        cost: v[3],
                        peek,
                    }
                }
            ),
        ]
    }

    /// Commands of kinds read through serde, inside an entry read directly.
    fn others() -> impl Strategy<Value = KeyCmd> {
        let k = proptest::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from);
        prop_oneof![
            (k.clone(), k.clone(), any::<u64>()).prop_map(|(key, value, ms)| KeyCmd::Set {
                key,
                value,
                expiry: SetExpiry::In(ms),
                cond: SetCond::IfAbsent,
                get: true,
            }),
            proptest::collection::vec(k.clone(), 0..4).prop_map(KeyCmd::Del),
            k.prop_map(KeyCmd::Persist),
        ]
    }

    fn any_u64() -> impl Strategy<Value = u64> {
        // Every width of bincode's integers, and their edges.
        prop_oneof![
            0u64..251,
            251u64..=0xffff,
            0x1_0000u64..=0xffff_ffff,
            Just(u64::MAX),
            any::<u64>()
        ]
    }

    fn entry(cmds: Vec<KeyCmd>, origin: Option<(u64, u64)>, ids: [u64; 4]) -> Entry {
        let origin = origin.map(|(run, seq)| Origin { run, seq });
        Entry::new_normal(
            log_id(ids[0], ids[1], ids[2]),
            Proposal::new(ids[3], origin, cmds),
        )
    }

    /// Both ways give the same entry (compared by what it encodes to) and the same length.
    fn same(src: &Bytes, direct: &(Entry, usize)) -> Result<(), TestCaseError> {
        let (e, used) = through_serde(src).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(used, direct.1);
        prop_assert_eq!(encode(&e), encode(&direct.0));
        prop_assert_eq!(format!("{e:?}"), format!("{:?}", direct.0));
        Ok(())
    }

    proptest! {
        #[test]
        fn entries_read_directly_decode_as_serde_does(
            cmds in proptest::collection::vec(prop_oneof![4 => read_directly(), 1 => others()], 0..40),
            origin in proptest::option::of((any_u64(), any_u64())),
            ids in [any_u64(), any_u64(), any_u64(), any_u64()],
            tail in proptest::collection::vec(any::<u8>(), 0..4),
        ) {
            let mut bytes = encode(&entry(cmds, origin, ids));
            let len = bytes.len();
            bytes.extend_from_slice(&tail);
            let src = Bytes::from(bytes);
            let direct = Reader::new(&src, 0).entry();
            prop_assert!(direct.is_some(), "not read directly");
            let direct = direct.unwrap();
            prop_assert_eq!(direct.1, len);
            same(&src, &direct)?;
            // As a follower decodes it: the same, and every string a view into the source,
            // those of commands decoded through serde too.
            let decoded = decode_entry(&src, 0).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(decoded.1, len);
            prop_assert_eq!(encode(&decoded.0), encode(&direct.0));
            let openraft::EntryPayload::Normal(p) = &decoded.0.payload else {
                return Err(TestCaseError::fail("not a normal entry"));
            };
            let range = src.as_ptr() as usize..src.as_ptr() as usize + src.len();
            for c in p.cmds.iter() {
                if let Some(k) = c.single_key().filter(|k| !k.is_empty()) {
                    prop_assert!(range.contains(&(k.as_ptr() as usize)), "{c:?}");
                }
            }
        }

        /// Whatever the bytes, an entry read directly is one serde reads the same.
        #[test]
        fn damaged_entries_are_read_directly_only_as_serde_reads_them(
            cmds in proptest::collection::vec(read_directly(), 1..6),
            ids in [any_u64(), any_u64(), any_u64(), any_u64()],
            damage in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut bytes = encode(&entry(cmds, Some((1, 2)), ids));
            for (at, b) in damage {
                let i = at.index(bytes.len());
                bytes[i] = b;
            }
            let keep = cut.index(bytes.len() + 1);
            bytes.truncate(keep.max(bytes.len() / 2));
            let src = Bytes::from(bytes);
            if let Some(direct) = Reader::new(&src, 0).entry() {
                same(&src, &direct)?;
            }
            // And decode_entry agrees with serde whichever way it went.
            match (decode_entry(&src, 0), through_serde(&src)) {
                (Ok(a), Ok(b)) => {
                    prop_assert_eq!(a.1, b.1);
                    prop_assert_eq!(encode(&a.0), encode(&b.0));
                }
                (Err(_), Err(_)) => {}
                (a, b) => prop_assert!(false, "{:?} against {:?}", a.map(|x| x.1), b.map(|x| x.1)),
            }
        }
    }

    #[test]
    fn other_entries_and_a_non_shortest_integer_are_left_to_serde() {
        let blank = Entry::new_blank(log_id(3, 2, 9));
        let src = Bytes::from(encode(&blank));
        assert!(Reader::new(&src, 0).entry().is_none());
        let (e, used) = decode_entry(&src, 0).unwrap();
        assert_eq!((e.log_id, used), (blank.log_id, src.len()));

        // The term written in three bytes rather than one: serde reads it, this reader
        // does not.
        let normal = entry(vec![KeyCmd::Get(key(b"k"))], None, [5, 1, 7, 8]);
        let mut bytes = encode(&normal);
        assert_eq!(bytes[0], 5);
        bytes.splice(0..1, [251, 5, 0]);
        let src = Bytes::from(bytes);
        assert!(Reader::new(&src, 0).entry().is_none());
        let (e, used) = through_serde(&src).unwrap();
        let (d, d_used) = decode_entry(&src, 0).unwrap();
        assert_eq!((encode(&d), d_used), (encode(&e), used));
        assert_eq!(d.log_id, normal.log_id);
    }

    #[test]
    fn an_entry_is_read_from_where_it_starts() {
        let a = encode(&entry(vec![KeyCmd::Get(key(b"a"))], None, [1, 1, 1, 1]));
        let b = entry(
            vec![KeyCmd::IncrBy {
                key: key(b"bb"),
                delta: -3,
            }],
            Some((4, 5)),
            [2, 1, 2, 2],
        );
        let mut bytes = a.clone();
        bytes.extend(encode(&b));
        let src = Bytes::from(bytes);
        let (got, used) = decode_entry(&src, a.len()).unwrap();
        assert_eq!(used, src.len() - a.len());
        assert_eq!(encode(&got), encode(&b));
    }
}
