//! How one key is kept: its value as callers see it (`Value`, `EntryView`), detached from the
//! store for snapshots (`OwnedValue`, `Record`), and the packed record that holds it in a
//! partition's arena.
//!
//! A packed record is `key header + key + tag (1 byte) + payload`. The key header is the key's
//! length in one byte, or `0xFF` and a 4-byte little-endian length for keys of 255 bytes or
//! more. The tag says which kind of value follows and whether an expiry is stored, and fixes
//! the payload's size (strings and hashes carry their length, semaphores their room): a GCRA
//! bucket whose expiry is its tat, the common case, takes `1 + key + 1 + 8` bytes. A record
//! replaced by one of another size is marked dead in place and left for compaction.
//!
//! A semaphore's record has room for more holders than it holds (`semaphore_room`), so that
//! taking and giving back slots rewrites it in place instead of leaving a dead copy of the
//! whole holder list behind at every change.
//!
//! A hash is one record holding all its fields, packed (`Fields`): the hash commands read and
//! rewrite the whole record, which their bounds (`cmd::hashes`) keep small.
//!
//! The functions here read and write arena bytes at offsets the index holds. They run on every
//! request and are called from the table's module, hence `#[inline]`.

use super::coll::{Coll, Colls, OwnedColl};
use crate::limiter::State;
use serde::{Deserialize, Serialize};

/// A key's value, borrowed from the arena for reading or given for writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// Limiter state.
    Bucket(State),
    /// A counter set by INCR or by SET with an integer.
    Int(i64),
    /// Any other string.
    Str(&'a [u8]),
    /// A concurrency limit's slots (BK.ACQUIRE).
    Semaphore(Semaphore<'a>),
    /// A hash's fields and values (HSET).
    Hash(Fields<'a>),
    /// A sorted set, a list or a set, kept beside the arena (`coll`).
    Coll(&'a Coll),
}

impl Value<'_> {
    /// True when the value decides its key's expiry: a bucket expires when it is full again, a
    /// semaphore when its last holder's time is up. EXPIRE and PERSIST leave such keys alone,
    /// since moving the expiry would refund tokens or free slots early.
    pub fn sets_own_expiry(&self) -> bool {
        matches!(self, Value::Bucket(_) | Value::Semaphore(_))
    }
}

/// A concurrency limit as stored: the holders of its slots, and the next token to hand out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Semaphore<'a> {
    /// No token below this is handed out again while the key lives.
    pub next_token: u64,
    pub holders: Holders<'a>,
}

/// One held slot: the token its holder gives back, and when it frees itself (ns since the
/// epoch). Part of [`OwnedValue`]'s encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub token: u64,
    pub deadline: u64,
}

/// A semaphore's holders as packed bytes: per holder its token and deadline, each a
/// little-endian u64, in no particular order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Holders<'a>(&'a [u8]);

impl<'a> Holders<'a> {
    /// Bytes one holder takes.
    pub const SIZE: usize = 16;

    /// Packs `holders` into `out` (cleared first) and returns a view of them.
    pub fn pack(holders: &[Holder], out: &'a mut Vec<u8>) -> Holders<'a> {
        out.clear();
        out.reserve(holders.len() * Self::SIZE);
        for h in holders {
            out.extend_from_slice(&h.token.to_le_bytes());
            out.extend_from_slice(&h.deadline.to_le_bytes());
        }
        let out: &'a Vec<u8> = out;
        Holders(out)
    }

    pub fn len(&self) -> usize {
        self.0.len() / Self::SIZE
    }

    pub fn is_empty(&self) -> bool {
        self.0.len() < Self::SIZE
    }

    pub fn iter(&self) -> impl Iterator<Item = Holder> + 'a {
        self.0.chunks_exact(Self::SIZE).map(|c| Holder {
            token: rd64(c, 0),
            deadline: rd64(c, 8),
        })
    }

    fn as_bytes(&self) -> &'a [u8] {
        self.0
    }
}

/// A hash's fields and values as packed bytes: per field, its name and then its value, each a
/// little-endian u32 length followed by the bytes, in the order the fields were added (a field
/// keeps its place when its value changes), as Redis keeps a small hash.
///
/// Only `Fields::pack` makes one, but reading never trusts the lengths: a length that runs
/// past the end stops the iteration instead of panicking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    /// Packs `pairs` into `out` (cleared first) and returns a view of them. The caller keeps
    /// each name and value below 4 GiB (the hash commands' bounds are far below).
    pub fn pack<F, V>(pairs: impl IntoIterator<Item = (F, V)>, out: &'a mut Vec<u8>) -> Fields<'a>
    where
        F: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        out.clear();
        for (f, v) in pairs {
            for part in [f.as_ref(), v.as_ref()] {
                let n = u32::try_from(part.len()).unwrap_or(u32::MAX);
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(&part[..n as usize]);
            }
        }
        let out: &'a Vec<u8> = out;
        Fields(out)
    }

    /// The fields and their values, in order.
    pub fn iter(&self) -> FieldIter<'a> {
        FieldIter(self.0)
    }

    /// The value of `field`, if the hash has it.
    pub fn get(&self, field: &[u8]) -> Option<&'a [u8]> {
        self.iter().find(|(f, _)| *f == field).map(|(_, v)| v)
    }

    /// How many fields the hash has.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// The packed bytes, lengths included.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.0
    }
}

/// The (field, value) pairs of packed [`Fields`].
pub struct FieldIter<'a>(&'a [u8]);

impl<'a> FieldIter<'a> {
    fn part(&mut self) -> Option<&'a [u8]> {
        let len = self.0.get(..4)?;
        let n = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let part = self.0.get(4..4usize.checked_add(n)?)?;
        self.0 = &self.0[4 + n..];
        Some(part)
    }
}

impl<'a> Iterator for FieldIter<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let pair = self.part().zip(self.part());
        if pair.is_none() {
            self.0 = &[];
        }
        pair
    }
}

/// A value detached from the store, for snapshots. Part of [`Record`]'s encoding.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OwnedValue {
    Bucket(State),
    Int(i64),
    Str(Vec<u8>),
    // New variants go below this line only: the enum's variant order is its encoding.
    Semaphore {
        next_token: u64,
        holders: Vec<Holder>,
    },
    /// A hash's (field, value) pairs, in order.
    Hash(Vec<(Vec<u8>, Vec<u8>)>),
    /// A sorted set, a list or a set.
    Coll(OwnedColl),
}

impl From<Value<'_>> for OwnedValue {
    fn from(v: Value<'_>) -> OwnedValue {
        match v {
            Value::Bucket(s) => OwnedValue::Bucket(s),
            Value::Int(i) => OwnedValue::Int(i),
            Value::Str(s) => OwnedValue::Str(s.to_vec()),
            Value::Semaphore(s) => OwnedValue::Semaphore {
                next_token: s.next_token,
                holders: s.holders.iter().collect(),
            },
            Value::Hash(h) => {
                OwnedValue::Hash(h.iter().map(|(f, v)| (f.to_vec(), v.to_vec())).collect())
            }
            Value::Coll(c) => OwnedValue::Coll(c.to_owned_coll()),
        }
    }
}

impl OwnedValue {
    /// The value to store; `scratch` holds a semaphore's packed holders or a hash's packed
    /// fields, `coll` a collection rebuilt from its detached form.
    pub fn as_value<'a>(
        &'a self,
        scratch: &'a mut Vec<u8>,
        coll: &'a mut Option<Coll>,
    ) -> Value<'a> {
        match self {
            OwnedValue::Bucket(s) => Value::Bucket(*s),
            OwnedValue::Int(i) => Value::Int(*i),
            OwnedValue::Str(s) => Value::Str(s),
            OwnedValue::Semaphore {
                next_token,
                holders,
            } => Value::Semaphore(Semaphore {
                next_token: *next_token,
                holders: Holders::pack(holders, scratch),
            }),
            OwnedValue::Hash(pairs) => {
                Value::Hash(Fields::pack(pairs.iter().map(|(f, v)| (f, v)), scratch))
            }
            OwnedValue::Coll(c) => Value::Coll(coll.insert(Coll::from_owned(c))),
        }
    }
}

/// One key detached from the store (name, value, expiry), as it travels in a snapshot.
///
/// Snapshots are bincode-encoded and written to disk, so this type and [`OwnedValue`] are an
/// on-disk format: their fields, variants and order must keep their encoding (golden bytes in
/// tests/encoding.rs); a new variant goes at the end.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    pub key: Vec<u8>,
    pub value: OwnedValue,
    pub expires_at: u64,
}

/// A live key as read from the store.
#[derive(Debug, Clone, Copy)]
pub struct EntryView<'a> {
    pub value: Value<'a>,
    /// Absolute expiry in ns since the epoch; 0 = never.
    pub expires_at: u64,
}

// Record tags. The payload that follows each is fixed by the tag (strings carry a length).
const T_GCRA: u8 = 0; // tat (also its expiry)
const T_GCRA_EXP: u8 = 1; // tat, expiry
const T_FIXED: u8 = 2; // expiry, start, count
const T_SLIDING: u8 = 3; // expiry, start, prev, cur
const T_INT: u8 = 4; // value
const T_INT_EXP: u8 = 5; // value, expiry
const T_STR: u8 = 6; // len u32, bytes
const T_STR_EXP: u8 = 7; // expiry, len u32, bytes
const T_ALIGNED: u8 = 8; // expiry, start, count
const T_SEMAPHORE: u8 = 9; // expiry, next token, holders u32, room u32, room * 16 bytes
const T_HASH: u8 = 10; // expiry, len u32, packed fields
const T_COLL: u8 = 11; // expiry, collection number u32 (in the partition's `Colls`)
const T_DEAD: u8 = 0xFF;

#[inline]
pub(super) fn rd64(a: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&a[at..at + 8]);
    u64::from_le_bytes(b)
}

#[inline]
pub(super) fn rd32(a: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&a[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Where a packed record's key and tag are.
pub(super) struct Layout {
    pub(super) key_start: usize,
    pub(super) key_len: usize,
    pub(super) tag_at: usize,
}

#[inline]
pub(super) fn layout(a: &[u8], off: usize) -> Layout {
    if a[off] < 0xFF {
        let key_len = a[off] as usize;
        Layout {
            key_start: off + 1,
            key_len,
            tag_at: off + 1 + key_len,
        }
    } else {
        let key_len = rd32(a, off + 1) as usize;
        Layout {
            key_start: off + 5,
            key_len,
            tag_at: off + 5 + key_len,
        }
    }
}

#[inline]
pub(super) fn key_of(a: &[u8], off: usize) -> &[u8] {
    let l = layout(a, off);
    &a[l.key_start..l.key_start + l.key_len]
}

#[inline]
pub(super) fn key_header_len(key_len: usize) -> usize {
    if key_len < 0xFF { 1 } else { 5 }
}

/// Bytes of payload after the tag.
#[inline]
pub(super) fn payload_len(a: &[u8], tag: u8, at: usize) -> usize {
    match tag {
        T_GCRA | T_INT => 8,
        T_GCRA_EXP | T_INT_EXP => 16,
        T_FIXED | T_ALIGNED => 24,
        T_SLIDING => 32,
        T_STR => 4 + rd32(a, at) as usize,
        T_STR_EXP => 12 + rd32(a, at + 8) as usize,
        T_SEMAPHORE => 24 + rd32(a, at + 20) as usize * Holders::SIZE,
        T_HASH => 12 + rd32(a, at + 8) as usize,
        T_COLL => 12,
        _ => 0,
    }
}

/// How many holders a semaphore's record has room for, given how many it holds and the room
/// of the record it replaces (0 for none). The room is kept while the count moves within
/// (a quarter of it, all of it], so a semaphore that hovers around a size is rewritten in
/// place; outside that it becomes the next power of two, at least 4. Growing doubles and
/// shrinking halves, so the bytes copied to new records are amortized O(1) per change, and a
/// record is never more than four times the size its holders need (plus the minimum).
#[inline]
pub(super) fn semaphore_room(holders: usize, room: usize) -> usize {
    if holders <= room && holders * 4 > room {
        room
    } else {
        holders.next_power_of_two().max(4)
    }
}

/// The room of the semaphore record at `off`, or 0 if it holds something else.
#[inline]
pub(super) fn room_of(a: &[u8], off: usize) -> usize {
    let l = layout(a, off);
    if a[l.tag_at] == T_SEMAPHORE {
        rd32(a, l.tag_at + 21) as usize
    } else {
        0
    }
}

#[inline]
pub(super) fn record_len(a: &[u8], off: usize) -> usize {
    let l = layout(a, off);
    let tag = a[l.tag_at];
    l.tag_at + 1 - off + payload_len(a, tag, l.tag_at + 1)
}

/// The collection number of the record at `off`, if it holds a collection.
#[inline]
pub(super) fn coll_id(a: &[u8], off: usize) -> Option<u32> {
    let l = layout(a, off);
    (a[l.tag_at] == T_COLL).then(|| rd32(a, l.tag_at + 9))
}

/// The payload of a collection's record: its expiry and its number in the partition's `Colls`.
#[inline]
pub(super) fn encode_coll(id: u32, expires_at: u64, out: &mut Vec<u8>) {
    out.push(T_COLL);
    out.extend_from_slice(&expires_at.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
}

/// Rewrites the expiry of a collection's record in place; false if it holds something else.
#[inline]
pub(super) fn set_coll_expiry(a: &mut [u8], off: usize, expires_at: u64) -> bool {
    let l = layout(a, off);
    if a[l.tag_at] != T_COLL {
        return false;
    }
    a[l.tag_at + 1..l.tag_at + 9].copy_from_slice(&expires_at.to_le_bytes());
    true
}

#[inline]
pub(super) fn view<'a>(a: &'a [u8], colls: &'a Colls, off: usize) -> EntryView<'a> {
    let l = layout(a, off);
    let p = l.tag_at + 1;
    match a[l.tag_at] {
        T_GCRA => {
            let tat = rd64(a, p);
            EntryView {
                value: Value::Bucket(State::Gcra { tat }),
                expires_at: tat,
            }
        }
        T_GCRA_EXP => EntryView {
            value: Value::Bucket(State::Gcra { tat: rd64(a, p) }),
            expires_at: rd64(a, p + 8),
        },
        T_FIXED => EntryView {
            value: Value::Bucket(State::Fixed {
                start: rd64(a, p + 8),
                count: rd64(a, p + 16),
            }),
            expires_at: rd64(a, p),
        },
        T_ALIGNED => EntryView {
            value: Value::Bucket(State::Aligned {
                start: rd64(a, p + 8),
                count: rd64(a, p + 16),
            }),
            expires_at: rd64(a, p),
        },
        T_SLIDING => EntryView {
            value: Value::Bucket(State::Sliding {
                start: rd64(a, p + 8),
                prev: rd64(a, p + 16),
                cur: rd64(a, p + 24),
            }),
            expires_at: rd64(a, p),
        },
        T_INT => EntryView {
            value: Value::Int(rd64(a, p) as i64),
            expires_at: 0,
        },
        T_INT_EXP => EntryView {
            value: Value::Int(rd64(a, p) as i64),
            expires_at: rd64(a, p + 8),
        },
        T_STR => {
            let n = rd32(a, p) as usize;
            EntryView {
                value: Value::Str(&a[p + 4..p + 4 + n]),
                expires_at: 0,
            }
        }
        T_STR_EXP => {
            let n = rd32(a, p + 8) as usize;
            EntryView {
                value: Value::Str(&a[p + 12..p + 12 + n]),
                expires_at: rd64(a, p),
            }
        }
        T_SEMAPHORE => {
            let n = rd32(a, p + 16) as usize;
            EntryView {
                value: Value::Semaphore(Semaphore {
                    next_token: rd64(a, p + 8),
                    holders: Holders(&a[p + 24..p + 24 + n * Holders::SIZE]),
                }),
                expires_at: rd64(a, p),
            }
        }
        T_HASH => {
            let n = rd32(a, p + 8) as usize;
            EntryView {
                value: Value::Hash(Fields(&a[p + 12..p + 12 + n])),
                expires_at: rd64(a, p),
            }
        }
        T_COLL => match colls.get(rd32(a, p + 8)) {
            Some(c) => EntryView {
                value: Value::Coll(c),
                expires_at: rd64(a, p),
            },
            None => EntryView {
                value: Value::Int(0),
                expires_at: 1,
            },
        },
        // Dead records are never reachable from the index; read as an expired counter.
        _ => EntryView {
            value: Value::Int(0),
            expires_at: 1,
        },
    }
}

/// The tag and payload bytes for a value. `room` is the semaphore room of the record being
/// replaced (0 for none; see `semaphore_room`); other values ignore it.
#[inline]
pub(super) fn encode_payload(value: Value<'_>, expires_at: u64, room: usize, out: &mut Vec<u8>) {
    let push = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&v.to_le_bytes());
    match value {
        Value::Bucket(State::Gcra { tat }) if tat == expires_at => {
            out.push(T_GCRA);
            push(out, tat);
        }
        Value::Bucket(State::Gcra { tat }) => {
            out.push(T_GCRA_EXP);
            push(out, tat);
            push(out, expires_at);
        }
        Value::Bucket(State::Fixed { start, count }) => {
            out.push(T_FIXED);
            push(out, expires_at);
            push(out, start);
            push(out, count);
        }
        Value::Bucket(State::Aligned { start, count }) => {
            out.push(T_ALIGNED);
            push(out, expires_at);
            push(out, start);
            push(out, count);
        }
        Value::Bucket(State::Sliding { start, prev, cur }) => {
            out.push(T_SLIDING);
            push(out, expires_at);
            push(out, start);
            push(out, prev);
            push(out, cur);
        }
        Value::Int(v) if expires_at == 0 => {
            out.push(T_INT);
            push(out, v as u64);
        }
        Value::Int(v) => {
            out.push(T_INT_EXP);
            push(out, v as u64);
            push(out, expires_at);
        }
        Value::Str(s) => {
            // Values are bounded by the protocol's bulk limit, far below 4 GiB.
            let n = u32::try_from(s.len()).unwrap_or(u32::MAX);
            if expires_at == 0 {
                out.push(T_STR);
            } else {
                out.push(T_STR_EXP);
                push(out, expires_at);
            }
            out.extend_from_slice(&n.to_le_bytes());
            out.extend_from_slice(&s[..n as usize]);
        }
        Value::Semaphore(sem) => {
            let held = sem.holders.as_bytes();
            let count = sem.holders.len();
            let room = semaphore_room(count, room);
            out.push(T_SEMAPHORE);
            push(out, expires_at);
            push(out, sem.next_token);
            // Holders are bounded by BK.ACQUIRE's limit cap, far below 2^32.
            let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX).to_le_bytes();
            out.extend_from_slice(&n(count));
            out.extend_from_slice(&n(room));
            out.extend_from_slice(&held[..count * Holders::SIZE]);
            // The spare room is zeros; it is never read.
            out.resize(out.len() + (room - count) * Holders::SIZE, 0);
        }
        Value::Hash(fields) => {
            // Hashes are bounded by the hash commands' byte cap, far below 4 GiB.
            let bytes = fields.as_bytes();
            let n = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
            out.push(T_HASH);
            push(out, expires_at);
            out.extend_from_slice(&n.to_le_bytes());
            out.extend_from_slice(&bytes[..n as usize]);
        }
        // The table stores a collection before encoding its record (`encode_coll`), so this
        // is never reached; a record naming no collection reads as expired.
        Value::Coll(_) => encode_coll(u32::MAX, 1, out),
    }
}

#[inline]
pub(super) fn is_expired(expires_at: u64, now: u64) -> bool {
    expires_at != 0 && expires_at <= now
}

/// Appends a record (key header, key, encoded payload); returns its offset, or None if the
/// arena would pass 4 GiB.
#[inline]
pub(super) fn append(arena: &mut Vec<u8>, key: &[u8], payload: &[u8]) -> Option<u32> {
    let off = u32::try_from(arena.len()).ok()?;
    let key_len = u32::try_from(key.len()).ok()?;
    if arena.len() + key.len() + payload.len() + 5 > u32::MAX as usize {
        return None;
    }
    if key.len() < 0xFF {
        arena.push(key.len() as u8);
    } else {
        arena.push(0xFF);
        arena.extend_from_slice(&key_len.to_le_bytes());
    }
    arena.extend_from_slice(key);
    arena.extend_from_slice(payload);
    Some(off)
}

/// Marks the record at `off` dead; returns its length.
#[inline]
pub(super) fn kill(arena: &mut [u8], dead: &mut usize, off: usize) -> usize {
    let len = record_len(arena, off);
    let l = layout(arena, off);
    arena[l.tag_at] = T_DEAD;
    *dead += len;
    len
}
