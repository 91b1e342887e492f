//! The log file's format (see the module above for the layout and its invariants): a record's
//! framing and checksums, its payload, replaying a file into every group's log, and where each
//! live record sits, which is what compaction copies.

use crate::cluster::typ::{Entry, GroupId, LogId, Vote, set_wire, wire_of};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

pub(super) const LOG_FILE: &str = "log.bin";
pub(super) const LOG_TMP: &str = "log.bin.tmp";
/// Where a background compaction builds the new file.
pub(super) const COMPACT_TMP: &str = "log.bin.compact";
pub(super) const LOCK_FILE: &str = "lock";

/// How long opening waits for the directory's previous owner to close it.
pub(super) const LOCK_WAIT: Duration = Duration::from_secs(10);

/// Record header: payload length, the length's checksum and the record's checksum.
pub(super) const HEADER: usize = 12;

/// Below this size the log file is never rewritten: dead records in a small file cost less than
/// copying it.
pub const COMPACT_MIN_BYTES: u64 = 1 << 20;

/// A file is rewritten once it is more than this many times the size of its live records.
/// Each rewrite copies the live records, so the copying per byte appended is about
/// 1 / (ratio - 1) of a byte: at 4 a third of what rewriting at half dead costs, for a file up
/// to four times its live records (which the log's memory bound limits).
pub const COMPACT_RATIO: u64 = 4;

/// A committed log id waits at most this long for other changes to share its write. It only
/// shortens recovery (entries up to it are re-applied at start; later ones are committed again
/// by the leader), so writing it on its own for every commit would cost a write for nothing.
pub(super) const COMMITTED_EVERY: Duration = Duration::from_millis(100);

/// One record of `log.bin`, as decoded on replay.
#[derive(Deserialize)]
pub(super) struct LogRecord {
    pub(super) group: GroupId,
    pub(super) change: Change,
}

/// One change to a group's log.
#[derive(Deserialize)]
pub(super) enum Change {
    /// An entry; it replaces any entry at its index or above, so the log never has a hole.
    Entry(Entry),
    /// Drops every entry above the index (every entry when None).
    TruncateAfter(Option<u64>),
    /// Drops every entry up to and including the log id's index.
    Purge(LogId),
    Vote(Vote),
    Committed(Option<LogId>),
}

/// The same record as [`LogRecord`], borrowed for encoding: the fields must stay in the same order
/// and the variants of [`ChangeRef`] in the order of [`Change`]'s, because bincode writes fields
/// by position and identifies a variant by its position.
#[derive(Serialize)]
pub(super) struct LogRecordRef<'a> {
    pub(super) group: GroupId,
    pub(super) change: ChangeRef<'a>,
}

#[derive(Serialize)]
pub(super) enum ChangeRef<'a> {
    Entry(&'a Entry),
    TruncateAfter(Option<u64>),
    Purge(&'a LogId),
    Vote(&'a Vote),
    Committed(Option<&'a LogId>),
}

pub(super) fn bincode_cfg() -> bincode::config::Configuration {
    bincode::config::standard()
}

pub(super) fn invalid_data(msg: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// io::Error is not Clone; the writer hands one failure to several waiters.
pub(super) fn copy_err(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

pub(super) fn writer_gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "raft log writer has stopped")
}

/// CRC-32C (Castagnoli) over the concatenation of `parts`, with the processor's CRC
/// instructions where it has them.
pub(super) fn crc32c(parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .fold(0, |crc, part| crc32c::crc32c_append(crc, part))
}

/// The variant number bincode gives `ChangeRef::Entry` (its place in the enum): a record that
/// holds an entry is the group, this, then the entry's own encoding.
const ENTRY_VARIANT: u32 = 0;

/// Appends one framed record to `out` and returns its size on disk. An entry that carries its
/// encoding (`Proposal::wire`) is written from those bytes, not encoded again.
pub(super) fn push_record(
    out: &mut Vec<u8>,
    group: GroupId,
    change: ChangeRef<'_>,
) -> io::Result<u64> {
    push_record_spanned(out, group, change).map(|(size, _)| size)
}

/// `push_record`, also giving where in `out` the entry's own encoding lies, for a record that
/// holds an entry.
pub(super) fn push_record_spanned(
    out: &mut Vec<u8>,
    group: GroupId,
    change: ChangeRef<'_>,
) -> io::Result<(u64, Option<std::ops::Range<usize>>)> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    let span = match change {
        ChangeRef::Entry(entry) => {
            // The same bytes as the record encoded whole: bincode writes a struct's fields
            // and an enum's variant number one after the other, with nothing around them.
            bincode::serde::encode_into_std_write((group, ENTRY_VARIANT), out, bincode_cfg())
                .map_err(invalid_data)?;
            let from = out.len();
            match wire_of(entry) {
                Some(bytes) => out.extend_from_slice(bytes),
                None => {
                    bincode::serde::encode_into_std_write(entry, out, bincode_cfg())
                        .map_err(invalid_data)?;
                }
            }
            Some(from..out.len())
        }
        change => {
            let rec = LogRecordRef { group, change };
            bincode::serde::encode_into_std_write(&rec, out, bincode_cfg())
                .map_err(invalid_data)?;
            None
        }
    };
    let payload_len = out.len() - start - HEADER;
    let len = u32::try_from(payload_len).map_err(|_| invalid_data("raft log record over 4 GiB"))?;
    let len_bytes = len.to_le_bytes();
    let crc = crc32c(&[&len_bytes, &out[start + HEADER..]]);
    out[start..start + 4].copy_from_slice(&len_bytes);
    out[start + 4..start + 8].copy_from_slice(&crc32c(&[&len_bytes]).to_le_bytes());
    out[start + 8..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(((out.len() - start) as u64, span))
}

pub(super) fn encode_record(group: GroupId, change: ChangeRef<'_>) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    push_record(&mut out, group, change)?;
    Ok(out)
}

/// What the bytes at some offset of `log.bin` hold.
pub(super) enum RecordAt<'a> {
    /// A whole record: its payload, and its size on disk header included.
    Whole { payload: &'a [u8], size: usize },
    /// The end of what a crashed writer managed to write.
    Torn,
    /// A damaged record with more data after it.
    Corrupt,
}

pub(super) fn record_at(rest: &[u8]) -> RecordAt<'_> {
    let Some(&[l0, l1, l2, l3, h0, h1, h2, h3, c0, c1, c2, c3]) = rest.get(..HEADER) else {
        return RecordAt::Torn;
    };
    let len_bytes = [l0, l1, l2, l3];
    // A crash can leave a record whose start made it to disk but whose rest did not, padded
    // with zeros up to the file size; anything else after a bad record is real damage.
    let torn_unless_data_from = |at: usize| {
        if rest.get(at..).unwrap_or_default().iter().all(|&b| b == 0) {
            RecordAt::Torn
        } else {
            RecordAt::Corrupt
        }
    };
    if crc32c(&[&len_bytes]) != u32::from_le_bytes([h0, h1, h2, h3]) {
        return torn_unless_data_from(HEADER);
    }
    // The length is the one written, so a record shorter than it was cut short by a crash.
    let size = HEADER.saturating_add(u32::from_le_bytes(len_bytes) as usize);
    let Some(payload) = rest.get(HEADER..size) else {
        return RecordAt::Torn;
    };
    if crc32c(&[&len_bytes, payload]) == u32::from_le_bytes([c0, c1, c2, c3]) {
        RecordAt::Whole { payload, size }
    } else {
        torn_unless_data_from(size)
    }
}

/// Drops every key above `after` (every key when None).
pub(super) fn cut_after<V>(map: &mut BTreeMap<u64, V>, after: Option<u64>) -> BTreeMap<u64, V> {
    match after {
        None => std::mem::take(map),
        Some(a) => match a.checked_add(1) {
            Some(from) => map.split_off(&from),
            None => BTreeMap::new(),
        },
    }
}

/// Drops every key up to and including `upto`.
pub(super) fn cut_upto<V>(map: &mut BTreeMap<u64, V>, upto: u64) -> BTreeMap<u64, V> {
    match upto.checked_add(1) {
        Some(from) => {
            let keep = map.split_off(&from);
            std::mem::replace(map, keep)
        }
        None => std::mem::take(map),
    }
}

/// Inserts at `index` after dropping everything at or above it: an entry appended over existing
/// ones replaces the conflicting suffix instead of leaving stale entries after it.
pub(super) fn put<V>(map: &mut BTreeMap<u64, V>, index: u64, value: V) -> BTreeMap<u64, V> {
    // Appends nearly always land past the last entry; `split_off` would still build (and then
    // free) a spine of empty nodes as tall as the tree for each of them.
    let removed = match map.last_key_value() {
        Some((&last, _)) if last >= index => map.split_off(&index),
        _ => BTreeMap::new(),
    };
    map.insert(index, value);
    removed
}

/// One group's log as readers see it, plus the small pieces of state saved beside it.
#[derive(Default)]
pub(super) struct Mem {
    pub(super) entries: BTreeMap<u64, Held>,
    /// What the entries held weigh: the sum of their `Held::size`, as the node bounds it.
    pub(super) bytes: u64,
    pub(super) last_purged: Option<LogId>,
    pub(super) vote: Option<Vote>,
    pub(super) committed: Option<LogId>,
    /// The newest entries that keep their encoding (`Proposal::wire`), oldest first, with its
    /// length, and what those encodings weigh together (at most `WIRE_KEEP`).
    wired: VecDeque<(u64, usize)>,
    wired_bytes: usize,
}

/// Most bytes of encodings a group's log keeps beside its newest entries, for the appends
/// that carry them to the followers right after they are written (a follower that lags
/// further gets older entries encoded anew). Not counted in `Mem::bytes`: at most this per
/// group on top of the bound (a leader's entries hold theirs as views into the buffer their
/// records were written from, which stays while any of its entries keeps its view). An entry
/// already applied, held as its encoding alone, keeps it past this window (`set_wire` leaves
/// it): it then weighs what its record does, which `Mem::bytes` counts.
pub(super) const WIRE_KEEP: usize = 1 << 20;

/// An entry held in memory, and the size of its record on disk (0 for a log kept only in
/// memory).
pub(super) struct Held {
    pub(super) entry: Entry,
    pub(super) size: u64,
}

fn weight(removed: &BTreeMap<u64, Held>) -> u64 {
    removed.values().map(|h| h.size).sum()
}

impl Mem {
    /// Puts `entry` at its index, dropping any entry at or after it.
    pub(super) fn put(&mut self, entry: Entry, size: u64) {
        let index = entry.log_id.index;
        let wired = wire_of(&entry).map(|w| w.len());
        let removed = put(&mut self.entries, index, Held { entry, size });
        self.bytes = self.bytes.saturating_sub(weight(&removed)) + size;
        if let Some(len) = wired {
            self.wired.push_back((index, len));
            self.wired_bytes += len;
            while self.wired_bytes > WIRE_KEEP {
                let Some((old, len)) = self.wired.pop_front() else {
                    break;
                };
                self.wired_bytes -= len;
                if let Some(held) = self.entries.get_mut(&old) {
                    set_wire(&mut held.entry, None);
                }
            }
        }
    }

    pub(super) fn truncate_after(&mut self, after: Option<u64>) {
        let removed = cut_after(&mut self.entries, after);
        self.bytes = self.bytes.saturating_sub(weight(&removed));
    }

    pub(super) fn purge(&mut self, log_id: &LogId) {
        let removed = cut_upto(&mut self.entries, log_id.index);
        self.bytes = self.bytes.saturating_sub(weight(&removed));
        if self.last_purged.as_ref() < Some(log_id) {
            self.last_purged = Some(*log_id);
        }
    }
}

/// Log index -> (offset, size) of the entry's record in `log.bin`.
pub(super) type Locations = BTreeMap<u64, (u64, u64)>;

/// Where one group's live records sit in `log.bin`: compaction copies them without decoding.
#[derive(Default, Clone)]
pub(super) struct GroupIndex {
    pub(super) entries: Locations,
    /// The latest purge marker and its framed record.
    pub(super) purged: Option<(LogId, Vec<u8>)>,
    /// The framed records of the latest vote and committed log id.
    pub(super) vote: Option<Vec<u8>>,
    pub(super) committed: Option<Vec<u8>>,
}

/// Every group's live records, and how many bytes of the file they take; the rest is dead.
#[derive(Default, Clone)]
pub(super) struct DiskIndex {
    pub(super) groups: BTreeMap<GroupId, GroupIndex>,
    pub(super) live_bytes: u64,
}

pub(super) fn record_bytes(removed: &Locations) -> u64 {
    removed.values().map(|&(_, size)| size).sum()
}

impl DiskIndex {
    pub(super) fn entry(&mut self, group: GroupId, index: u64, offset: u64, size: u64) {
        let g = self.groups.entry(group).or_default();
        let removed = put(&mut g.entries, index, (offset, size));
        self.live_bytes = self.live_bytes.saturating_sub(record_bytes(&removed)) + size;
    }

    pub(super) fn truncate_after(&mut self, group: GroupId, after: Option<u64>) {
        let g = self.groups.entry(group).or_default();
        let removed = cut_after(&mut g.entries, after);
        self.live_bytes = self.live_bytes.saturating_sub(record_bytes(&removed));
    }

    pub(super) fn purge(&mut self, group: GroupId, log_id: &LogId, record: &[u8]) {
        let g = self.groups.entry(group).or_default();
        let removed = cut_upto(&mut g.entries, log_id.index);
        self.live_bytes = self.live_bytes.saturating_sub(record_bytes(&removed));
        if g.purged.as_ref().is_none_or(|(p, _)| p < log_id) {
            let old = g.purged.replace((*log_id, record.to_vec()));
            let old_len = old.map_or(0, |(_, r)| r.len() as u64);
            self.live_bytes = self.live_bytes.saturating_sub(old_len) + record.len() as u64;
        }
    }

    pub(super) fn vote(&mut self, group: GroupId, record: &[u8]) {
        let g = self.groups.entry(group).or_default();
        let old = g.vote.replace(record.to_vec());
        let old_len = old.map_or(0, |r| r.len() as u64);
        self.live_bytes = self.live_bytes.saturating_sub(old_len) + record.len() as u64;
    }

    pub(super) fn committed(&mut self, group: GroupId, record: &[u8]) {
        let g = self.groups.entry(group).or_default();
        let old = g.committed.replace(record.to_vec());
        let old_len = old.map_or(0, |r| r.len() as u64);
        self.live_bytes = self.live_bytes.saturating_sub(old_len) + record.len() as u64;
    }
}

/// The result of replaying `log.bin`.
#[derive(Default)]
pub(super) struct Replayed {
    pub(super) groups: BTreeMap<GroupId, Mem>,
    pub(super) index: DiskIndex,
    /// Bytes up to the end of the last intact record.
    pub(super) valid_len: u64,
}

pub(super) fn replay(bytes: &[u8]) -> io::Result<Replayed> {
    let mut out = Replayed::default();
    let mut pos = 0usize;
    while let Some(rest) = bytes.get(pos..).filter(|r| !r.is_empty()) {
        let (payload, size) = match record_at(rest) {
            RecordAt::Whole { payload, size } => (payload, size),
            RecordAt::Torn => break,
            RecordAt::Corrupt => {
                return Err(invalid_data(format!(
                    "{LOG_FILE}: damaged record at offset {pos} with data after it"
                )));
            }
        };
        let (record, used): (LogRecord, usize) = crate::cluster::decode_bounded(payload)
            .map_err(|e| invalid_data(format!("{LOG_FILE}: record at offset {pos}: {e}")))?;
        if used != payload.len() {
            return Err(invalid_data(format!(
                "{LOG_FILE}: record at offset {pos} has trailing bytes"
            )));
        }
        let framed = rest.get(..size).unwrap_or_default();
        let group = record.group;
        let mem = out.groups.entry(group).or_default();
        match record.change {
            Change::Entry(entry) => {
                let index = entry.log_id.index;
                out.index.entry(group, index, pos as u64, size as u64);
                mem.put(entry, size as u64);
            }
            Change::TruncateAfter(after) => {
                out.index.truncate_after(group, after);
                mem.truncate_after(after);
            }
            Change::Purge(log_id) => {
                out.index.purge(group, &log_id, framed);
                mem.purge(&log_id);
            }
            Change::Vote(vote) => {
                out.index.vote(group, framed);
                mem.vote = Some(vote);
            }
            Change::Committed(committed) => {
                out.index.committed(group, framed);
                mem.committed = committed;
            }
        }
        pos += size;
    }
    out.valid_len = pos as u64;
    Ok(out)
}

/// Makes a rename or a file creation in `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Takes the exclusive lock of `dir`, held until the returned file is closed.
pub(super) fn lock_dir(dir: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(LOCK_FILE))?;
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(fs::TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!("{}: the raft log is open elsewhere", dir.display()),
                ));
            }
            Err(fs::TryLockError::Error(e)) if e.kind() == io::ErrorKind::Unsupported => {
                tracing::warn!(dir = %dir.display(), "file locks unsupported here; raft log unlocked");
                return Ok(file);
            }
            Err(fs::TryLockError::Error(e)) => return Err(e),
        }
    }
}

pub(super) fn open_log_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::typ::TypeConfig;

    fn blank(index: u64) -> Entry {
        <Entry as openraft::entry::RaftEntry>::new_blank(openraft::testing::log_id::<TypeConfig>(
            1, 1, index,
        ))
    }

    #[test]
    fn memory_weighs_the_records_of_the_entries_held() {
        let mut m = Mem::default();
        for i in 1..=5 {
            m.put(blank(i), 10 * i);
        }
        assert_eq!(m.bytes, 150);
        // An entry put over others replaces them and everything after them.
        m.put(blank(4), 1);
        assert_eq!(m.bytes, 10 + 20 + 30 + 1);
        // Over the last entry itself.
        m.put(blank(4), 2);
        assert_eq!(m.bytes, 10 + 20 + 30 + 2);
        assert_eq!(m.entries.len(), 4);
        m.put(blank(4), 1);
        m.truncate_after(Some(2));
        assert_eq!(m.bytes, 30);
        m.purge(&openraft::testing::log_id::<TypeConfig>(1, 1, 1));
        assert_eq!(m.bytes, 20);
        m.truncate_after(None);
        assert_eq!((m.bytes, m.entries.len()), (0, 0));
    }

    #[test]
    fn replay_weighs_each_entry_by_its_record() {
        let mut log = Vec::new();
        let mut sizes = Vec::new();
        for i in 1..=3 {
            sizes.push(push_record(&mut log, 2, ChangeRef::Entry(&blank(i))).unwrap());
        }
        push_record(&mut log, 2, ChangeRef::TruncateAfter(Some(2))).unwrap();
        let replayed = replay(&log).unwrap();
        assert_eq!(replayed.groups[&2].bytes, sizes[0] + sizes[1]);
    }

    #[test]
    fn crc32c_check_value() {
        assert_eq!(crc32c(&[b"123456789"]), 0xE306_9283);
        assert_eq!(crc32c(&[b"1234", b"56789"]), 0xE306_9283);
    }

    #[test]
    fn zero_filled_tail_is_torn_and_garbage_is_corrupt() {
        let mut log = Vec::new();
        push_record(&mut log, 3, ChangeRef::TruncateAfter(Some(3))).unwrap();
        let good = log.len();
        let mut zeros = log.clone();
        zeros.extend_from_slice(&[0; 40]);
        assert_eq!(replay(&zeros).unwrap().valid_len, good as u64);

        let mut damaged = log.clone();
        push_record(&mut damaged, 4, ChangeRef::TruncateAfter(Some(4))).unwrap();
        push_record(&mut damaged, 3, ChangeRef::TruncateAfter(Some(5))).unwrap();
        damaged[good + HEADER] ^= 0x55;
        assert!(replay(&damaged).is_err());
    }

    /// Records already on disk must keep decoding: a change here needs a format migration.
    #[test]
    fn golden_encoding() {
        let record = encode_record(7, ChangeRef::TruncateAfter(Some(300))).unwrap();
        // len 6, len_crc, crc, then group 7, variant 1 (TruncateAfter), Some, 300 as a varint.
        let want = [
            0x06, 0, 0, 0, 0xb5, 0x59, 0x22, 0x8c, 0x39, 0x70, 0x48, 0x61, 0x07, 0x01, 0x01, 0xfb,
            0x2c, 0x01,
        ];
        assert_eq!(record, want);

        let log_id = openraft::testing::log_id::<TypeConfig>(2, 1, 9);
        let entry = <Entry as openraft::entry::RaftEntry>::new_blank(log_id);
        let records = [
            encode_record(3, ChangeRef::Entry(&entry)).unwrap(),
            encode_record(3, ChangeRef::Purge(&log_id)).unwrap(),
            encode_record(3, ChangeRef::Vote(&Vote::new_committed(2, 1))).unwrap(),
            encode_record(3, ChangeRef::Committed(Some(&log_id))).unwrap(),
        ];
        let payloads: Vec<&[u8]> = records.iter().map(|r| &r[HEADER..]).collect();
        // Group 3, the variant, then: log id (term 2, node 1, index 9) and payload 0 (blank);
        // the log id; the vote (term 2, node 1, committed); Some and the log id.
        let want: [&[u8]; 4] = [
            &[3, 0, 2, 1, 9, 0],
            &[3, 2, 2, 1, 9],
            &[3, 3, 2, 1, 1],
            &[3, 4, 1, 2, 1, 9],
        ];
        assert_eq!(payloads, want);
    }

    #[test]
    fn damaged_length_is_corrupt_not_torn() {
        let mut log = Vec::new();
        for i in 0..3 {
            push_record(&mut log, 1, ChangeRef::TruncateAfter(Some(i))).unwrap();
        }
        let second = log.len() / 3;
        // A length that now points past the end of the file would look like a record cut
        // short, but its checksum gives it away.
        let mut damaged = log.clone();
        damaged[second + 3] ^= 0x40;
        assert!(replay(&damaged).is_err());
        // A header cut short, or one followed only by zeros, is torn.
        assert_eq!(replay(&log[..second + 5]).unwrap().valid_len, second as u64);
        let mut zeroed = log[..second + 6].to_vec();
        zeroed.resize(log.len(), 0);
        assert_eq!(replay(&zeroed).unwrap().valid_len, second as u64);
    }

    #[test]
    fn records_replay_to_their_own_group() {
        let mut log = Vec::new();
        let a = openraft::testing::log_id::<TypeConfig>(1, 1, 4);
        let b = openraft::testing::log_id::<TypeConfig>(2, 1, 9);
        push_record(&mut log, 1, ChangeRef::Purge(&a)).unwrap();
        push_record(&mut log, 2, ChangeRef::Committed(Some(&b))).unwrap();
        push_record(&mut log, 2, ChangeRef::Vote(&Vote::new(5, 1))).unwrap();
        push_record(&mut log, 2, ChangeRef::Vote(&Vote::new(6, 2))).unwrap();
        let replayed = replay(&log).unwrap();
        assert_eq!(replayed.valid_len, log.len() as u64);
        assert_eq!(replayed.groups[&1].last_purged, Some(a));
        assert_eq!(replayed.groups[&1].committed, None);
        assert_eq!(replayed.groups[&2].committed, Some(b));
        assert_eq!(replayed.groups[&2].vote, Some(Vote::new(6, 2)));
        // The superseded vote is dead: only the latest of each kind per group is live.
        let live: u64 = replayed.index.live_bytes;
        let first_vote = encode_record(2, ChangeRef::Vote(&Vote::new(5, 1))).unwrap();
        assert_eq!(live, log.len() as u64 - first_vote.len() as u64);
    }

    fn normal(index: u64, key: &str, key_len: usize) -> Entry {
        use crate::cmd::KeyCmd;
        <Entry as openraft::entry::RaftEntry>::new_normal(
            openraft::testing::log_id::<TypeConfig>(1, 1, index),
            crate::cluster::typ::Proposal::new(
                index,
                None,
                vec![KeyCmd::IncrBy {
                    key: bytes::Bytes::from(key.repeat(key_len)),
                    delta: 1,
                }],
            ),
        )
    }

    /// An entry that carries its encoding is written from those bytes, which are exactly
    /// what encoding it would have written.
    #[test]
    fn an_entry_record_is_written_from_the_bytes_it_carries() {
        let mut entry = normal(4, "k", 3);
        let encoded = bincode::serde::encode_to_vec(&entry, bincode_cfg()).unwrap();
        let mut plain = Vec::new();
        let (size, span) = push_record_spanned(&mut plain, 2, ChangeRef::Entry(&entry)).unwrap();
        assert_eq!(size, plain.len() as u64);
        assert_eq!(span.map(|s| plain[s].to_vec()), Some(encoded.clone()));
        let whole = bincode::serde::encode_to_vec(
            LogRecordRef {
                group: 2,
                change: ChangeRef::Entry(&entry),
            },
            bincode_cfg(),
        )
        .unwrap();
        assert_eq!(&plain[HEADER..], &whole[..]);

        set_wire(&mut entry, Some(encoded.into()));
        let mut carried = Vec::new();
        push_record(&mut carried, 2, ChangeRef::Entry(&entry)).unwrap();
        assert_eq!(carried, plain);

        // The carried bytes are what is written: carrying another entry's encoding, the
        // record replays as that other entry.
        let other = normal(4, "z", 5);
        let other_bytes = bincode::serde::encode_to_vec(&other, bincode_cfg()).unwrap();
        set_wire(&mut entry, Some(other_bytes.into()));
        let mut swapped = Vec::new();
        push_record(&mut swapped, 2, ChangeRef::Entry(&entry)).unwrap();
        let replayed = replay(&swapped).unwrap();
        let held = &replayed.groups[&2].entries[&4].entry;
        let again = bincode::serde::encode_to_vec(held, bincode_cfg()).unwrap();
        let want = bincode::serde::encode_to_vec(&other, bincode_cfg()).unwrap();
        assert_eq!(again, want);
    }

    /// Only the newest entries keep their encoding, at most `WIRE_KEEP` bytes of it.
    #[test]
    fn memory_keeps_the_encodings_of_the_newest_entries_only() {
        let mut m = Mem::default();
        let big = WIRE_KEEP * 3 / 10;
        for i in 1..=5 {
            let mut e = normal(i, "k", 1);
            set_wire(&mut e, Some(vec![0u8; big].into()));
            m.put(e, 1);
        }
        let kept: Vec<u64> = m
            .entries
            .iter()
            .filter(|(_, h)| wire_of(&h.entry).is_some())
            .map(|(&i, _)| i)
            .collect();
        assert_eq!(kept, vec![3, 4, 5]);
        // An entry without one (its own log encoding it) changes nothing.
        m.put(normal(6, "k", 1), 1);
        assert_eq!(m.entries.len(), 6);
        assert!(m.wired_bytes <= WIRE_KEEP);
    }
}
