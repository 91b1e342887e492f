//! The node's Raft log: every group's log entries, vote, committed log id and last purged log
//! id in one append-only file, written by one writer, and recovered when the node restarts.
//!
//! A node holds replicas of many groups. Giving each group its own files and writer would cost
//! one write and one fsync per group per turn; here a single writer takes every change queued by
//! every group since its last wake-up and writes them with one `write` (and, with fsync, one
//! `fdatasync`), then reports each change done. With fsync the writer is a thread of its own,
//! so no event loop waits for the disk; without it the writer runs on the event loop that
//! queued the changes, at the end of its turn (a write to the page cache costs less than
//! waking a thread). [`NodeLog`] owns the file and the writer;
//! [`NodeLog::group`] hands out a group's [`GroupLog`], which is that group's openraft log
//! storage and log reader.
//!
//! Every unpurged entry of every group is held in memory (openraft purges a group's log after
//! each snapshot, so this stays bounded) and reads never touch the disk. `append` returns as
//! soon as the entries are in memory and queued; openraft learns they are durable through the
//! append's callback. A vote, truncate or purge returns only once it is written (and fsynced
//! with fsync on). A committed log id is not waited for: it is written with the next batch
//! that carries anything else, or after at most `COMMITTED_EVERY` when nothing else comes.
//!
//! Directory layout (the `raft-log/` folder of the data dir):
//!
//! - `log.bin`: append-only records, each `[len: u32 LE][len_crc: u32 LE][crc: u32 LE][payload]`,
//!   where `len_crc` is CRC-32C over the length bytes (so a damaged length is told apart from a
//!   record cut short), `crc` is CRC-32C over the length bytes and the payload, and the payload
//!   is a bincode-encoded `LogRecord`: a group id and one change to that group's log. A change is
//!   an entry, "truncate after index N", "purge up to log id L", a vote or a committed log id.
//!   Replaying the records in order, each to its own group, rebuilds every group's log; for
//!   votes and committed log ids the latest record of a group wins. This is an on-disk format:
//!   `LogRecord`, `Change` and the types they carry must keep their encoding.
//! - `log.bin.tmp`, `log.bin.compact`: a compacted copy being written; removed when found at
//!   open.
//! - `lock`: empty; the open log holds an exclusive lock on it (see below).
//!
//! Compaction: groups purge at different times, so one file gathers dead records (purged,
//! truncated or overwritten entries, superseded votes, committed ids and purge markers). When
//! more than half of a file past `COMPACT_MIN_BYTES` is dead, the writer rewrites it as, for
//! each group, its latest purge marker, vote and committed log id followed by its live
//! entries, into `log.bin.tmp`, which is renamed over `log.bin` (with fsync on, the copy is
//! fsynced before the rename and the directory after it). A crash at any point leaves the old
//! file or the new one, both whole. Without fsync the copy is made on a blocking thread while
//! the groups go on appending to the old file (`log.bin.compact`); then, under the writer's
//! lock, what was appended meanwhile is copied after it, every record's place is carried over,
//! and the copy is renamed over `log.bin`, so a rewrite never stalls an event loop.
//!
//! A process killed in the middle of a write leaves a torn last record; replay recognises it
//! (cut short, or a bad checksum followed only by zeros, as a power loss can leave) and drops
//! it, cutting the file back to the last whole record. A bad checksum followed by more data is
//! corruption and opening fails rather than silently forgetting entries that may already be
//! committed.
//!
//! Only one `NodeLog` may have a directory open at a time, as the writer alone knows where each
//! record sits in the file. A node opens it once at start; the log stays open until it and
//! every group's handle are dropped, and the writer has finished the queued writes. Opening
//! waits up to `LOCK_WAIT` for a previous owner (a node of the same process that is still
//! stopping) to let go, then fails.

use crate::cluster::typ::{Entry, GroupId, LogId, LogState, TypeConfig, Vote};
use openraft::OptionalSend;
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

const LOG_FILE: &str = "log.bin";
const LOG_TMP: &str = "log.bin.tmp";
/// Where a background compaction builds the new file.
const COMPACT_TMP: &str = "log.bin.compact";
const LOCK_FILE: &str = "lock";

/// How long opening waits for the directory's previous owner to close it.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// Record header: payload length, the length's checksum and the record's checksum.
const HEADER: usize = 12;

/// Below this size the log file is never rewritten: dead records in a small file cost less than
/// copying it.
pub const COMPACT_MIN_BYTES: u64 = 1 << 20;

/// A committed log id waits at most this long for other changes to share its write. It only
/// shortens recovery (entries up to it are re-applied at start; later ones are committed again
/// by the leader), so writing it on its own for every commit would cost a write for nothing.
const COMMITTED_EVERY: Duration = Duration::from_millis(100);

/// One record of `log.bin`, as decoded on replay.
#[derive(Deserialize)]
struct LogRecord {
    group: GroupId,
    change: Change,
}

/// One change to a group's log.
#[derive(Deserialize)]
enum Change {
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
struct LogRecordRef<'a> {
    group: GroupId,
    change: ChangeRef<'a>,
}

#[derive(Serialize)]
enum ChangeRef<'a> {
    Entry(&'a Entry),
    TruncateAfter(Option<u64>),
    Purge(&'a LogId),
    Vote(&'a Vote),
    Committed(Option<&'a LogId>),
}

fn bincode_cfg() -> bincode::config::Configuration {
    bincode::config::standard()
}

fn invalid_data(msg: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// io::Error is not Clone; the writer hands one failure to several waiters.
fn copy_err(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

fn writer_gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "raft log writer has stopped")
}

/// CRC-32C (Castagnoli) over the concatenation of `parts`, with the processor's CRC
/// instructions where it has them.
fn crc32c(parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .fold(0, |crc, part| crc32c::crc32c_append(crc, part))
}

/// Appends one framed record to `out` and returns its size on disk.
fn push_record(out: &mut Vec<u8>, group: GroupId, change: ChangeRef<'_>) -> io::Result<u64> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    let rec = LogRecordRef { group, change };
    bincode::serde::encode_into_std_write(&rec, out, bincode_cfg()).map_err(invalid_data)?;
    let payload_len = out.len() - start - HEADER;
    let len = u32::try_from(payload_len).map_err(|_| invalid_data("raft log record over 4 GiB"))?;
    let len_bytes = len.to_le_bytes();
    let crc = crc32c(&[&len_bytes, &out[start + HEADER..]]);
    out[start..start + 4].copy_from_slice(&len_bytes);
    out[start + 4..start + 8].copy_from_slice(&crc32c(&[&len_bytes]).to_le_bytes());
    out[start + 8..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok((out.len() - start) as u64)
}

fn encode_record(group: GroupId, change: ChangeRef<'_>) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    push_record(&mut out, group, change)?;
    Ok(out)
}

/// What the bytes at some offset of `log.bin` hold.
enum RecordAt<'a> {
    /// A whole record: its payload, and its size on disk header included.
    Whole { payload: &'a [u8], size: usize },
    /// The end of what a crashed writer managed to write.
    Torn,
    /// A damaged record with more data after it.
    Corrupt,
}

fn record_at(rest: &[u8]) -> RecordAt<'_> {
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
fn cut_after<V>(map: &mut BTreeMap<u64, V>, after: Option<u64>) -> BTreeMap<u64, V> {
    match after {
        None => std::mem::take(map),
        Some(a) => match a.checked_add(1) {
            Some(from) => map.split_off(&from),
            None => BTreeMap::new(),
        },
    }
}

/// Drops every key up to and including `upto`.
fn cut_upto<V>(map: &mut BTreeMap<u64, V>, upto: u64) -> BTreeMap<u64, V> {
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
fn put<V>(map: &mut BTreeMap<u64, V>, index: u64, value: V) -> BTreeMap<u64, V> {
    let removed = map.split_off(&index);
    map.insert(index, value);
    removed
}

/// One group's log as readers see it, plus the small pieces of state saved beside it.
#[derive(Default)]
struct Mem {
    entries: BTreeMap<u64, Entry>,
    last_purged: Option<LogId>,
    vote: Option<Vote>,
    committed: Option<LogId>,
}

impl Mem {
    fn purge(&mut self, log_id: &LogId) {
        cut_upto(&mut self.entries, log_id.index);
        if self.last_purged.as_ref() < Some(log_id) {
            self.last_purged = Some(*log_id);
        }
    }
}

/// Log index -> (offset, size) of the entry's record in `log.bin`.
type Locations = BTreeMap<u64, (u64, u64)>;

/// Where one group's live records sit in `log.bin`: compaction copies them without decoding.
#[derive(Default, Clone)]
struct GroupIndex {
    entries: Locations,
    /// The latest purge marker and its framed record.
    purged: Option<(LogId, Vec<u8>)>,
    /// The framed records of the latest vote and committed log id.
    vote: Option<Vec<u8>>,
    committed: Option<Vec<u8>>,
}

/// Every group's live records, and how many bytes of the file they take; the rest is dead.
#[derive(Default, Clone)]
struct DiskIndex {
    groups: BTreeMap<GroupId, GroupIndex>,
    live_bytes: u64,
}

fn record_bytes(removed: &Locations) -> u64 {
    removed.values().map(|&(_, size)| size).sum()
}

impl DiskIndex {
    fn entry(&mut self, group: GroupId, index: u64, offset: u64, size: u64) {
        let g = self.groups.entry(group).or_default();
        let removed = put(&mut g.entries, index, (offset, size));
        self.live_bytes = self.live_bytes.saturating_sub(record_bytes(&removed)) + size;
    }

    fn truncate_after(&mut self, group: GroupId, after: Option<u64>) {
        let g = self.groups.entry(group).or_default();
        let removed = cut_after(&mut g.entries, after);
        self.live_bytes = self.live_bytes.saturating_sub(record_bytes(&removed));
    }

    fn purge(&mut self, group: GroupId, log_id: &LogId, record: &[u8]) {
        let g = self.groups.entry(group).or_default();
        let removed = cut_upto(&mut g.entries, log_id.index);
        self.live_bytes = self.live_bytes.saturating_sub(record_bytes(&removed));
        if g.purged.as_ref().is_none_or(|(p, _)| p < log_id) {
            let old = g.purged.replace((*log_id, record.to_vec()));
            let old_len = old.map_or(0, |(_, r)| r.len() as u64);
            self.live_bytes = self.live_bytes.saturating_sub(old_len) + record.len() as u64;
        }
    }

    fn vote(&mut self, group: GroupId, record: &[u8]) {
        let g = self.groups.entry(group).or_default();
        let old = g.vote.replace(record.to_vec());
        let old_len = old.map_or(0, |r| r.len() as u64);
        self.live_bytes = self.live_bytes.saturating_sub(old_len) + record.len() as u64;
    }

    fn committed(&mut self, group: GroupId, record: &[u8]) {
        let g = self.groups.entry(group).or_default();
        let old = g.committed.replace(record.to_vec());
        let old_len = old.map_or(0, |r| r.len() as u64);
        self.live_bytes = self.live_bytes.saturating_sub(old_len) + record.len() as u64;
    }
}

/// The result of replaying `log.bin`.
#[derive(Default)]
struct Replayed {
    groups: BTreeMap<GroupId, Mem>,
    index: DiskIndex,
    /// Bytes up to the end of the last intact record.
    valid_len: u64,
}

fn replay(bytes: &[u8]) -> io::Result<Replayed> {
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
        let (record, used): (LogRecord, usize) =
            bincode::serde::decode_from_slice(payload, bincode_cfg())
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
                put(&mut mem.entries, index, entry);
            }
            Change::TruncateAfter(after) => {
                out.index.truncate_after(group, after);
                cut_after(&mut mem.entries, after);
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
fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Takes the exclusive lock of `dir`, held until the returned file is closed.
fn lock_dir(dir: &Path) -> io::Result<File> {
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

fn open_log_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
}

/// Work for the writer thread; a group's jobs arrive in the order its memory changed.
enum Job {
    Append {
        group: GroupId,
        bytes: Vec<u8>,
        /// (log index, record size) of each entry in `bytes`, in order.
        records: Vec<(u64, u64)>,
        done: IOFlushed<TypeConfig>,
    },
    Committed {
        group: GroupId,
        bytes: Vec<u8>,
    },
    Vote {
        group: GroupId,
        bytes: Vec<u8>,
        done: oneshot::Sender<io::Result<()>>,
    },
    Truncate {
        group: GroupId,
        bytes: Vec<u8>,
        after: Option<u64>,
        done: oneshot::Sender<io::Result<()>>,
    },
    Purge {
        group: GroupId,
        bytes: Vec<u8>,
        log_id: LogId,
        done: oneshot::Sender<io::Result<()>>,
    },
}

/// Someone waiting for the batch their change is in to reach the disk.
enum Waiter {
    Flushed(IOFlushed<TypeConfig>),
    Done(oneshot::Sender<io::Result<()>>),
}

impl Waiter {
    fn complete(self, res: io::Result<()>) {
        match self {
            Waiter::Flushed(done) => done.io_completed(res),
            Waiter::Done(done) => {
                let _ = done.send(res);
            }
        }
    }
}

/// Counts of what the writer did, for tests and benches.
#[derive(Default)]
struct Stats {
    writes: AtomicU64,
    syncs: AtomicU64,
}

/// Owns the file; runs on its own thread.
struct LogWriter {
    dir: PathBuf,
    fsync: bool,
    file: File,
    len: u64,
    index: DiskIndex,
    /// After a failed write the on-disk log no longer matches what openraft was told, so every
    /// later write fails too.
    failed: Option<io::Error>,
    /// The records of this batch, and who waits for them.
    batch: Vec<u8>,
    waiters: Vec<Waiter>,
    /// The latest committed log id of each group not yet written (only the newest one
    /// matters), and since when the oldest of them waits.
    committed: BTreeMap<GroupId, Vec<u8>>,
    committed_since: Option<Instant>,
    /// No compaction is tried before the file reaches this size again after one failed.
    compact_from: u64,
    /// Compaction runs in the background (the writer runs on an event loop): it must not
    /// be run inline, and one is under way.
    background: bool,
    compacting: bool,
    stats: Arc<Stats>,
    /// Holds the directory's lock while the writer runs.
    _lock: File,
}

/// The first part of a background compaction: the live records of the file's first `len0`
/// bytes, written to `COMPACT_TMP`, and where each landed.
struct Prefix {
    index: DiskIndex,
    len: u64,
    len0: u64,
}

/// Writes the live records (by `index`) of the first `len0` bytes of the log to `tmp`.
fn write_prefix(dir: &Path, tmp: &Path, index: &DiskIndex, len0: u64) -> io::Result<Prefix> {
    let mut old = fs::read(dir.join(LOG_FILE))?;
    old.truncate(usize::try_from(len0).unwrap_or(usize::MAX));
    let (index, bytes) = live_records(index, &old)?;
    let mut f = File::create(tmp)?;
    f.write_all(&bytes)?;
    Ok(Prefix {
        index,
        len: bytes.len() as u64,
        len0,
    })
}

/// Every group's live records, as `index` places them in `old`, laid out afresh: the bytes
/// and their index.
fn live_records(index: &DiskIndex, old: &[u8]) -> io::Result<(DiskIndex, Vec<u8>)> {
    let capacity = usize::try_from(index.live_bytes).unwrap_or(0);
    let mut buf = Vec::with_capacity(capacity);
    let mut out = DiskIndex::default();
    for (&group, g) in &index.groups {
        if let Some((log_id, record)) = &g.purged {
            out.purge(group, log_id, record);
            buf.extend_from_slice(record);
        }
        if let Some(record) = &g.vote {
            out.vote(group, record);
            buf.extend_from_slice(record);
        }
        if let Some(record) = &g.committed {
            out.committed(group, record);
            buf.extend_from_slice(record);
        }
        for (&i, &(offset, size)) in &g.entries {
            let record = usize::try_from(offset)
                .ok()
                .zip(usize::try_from(offset + size).ok())
                .and_then(|(from, to)| old.get(from..to))
                .ok_or_else(|| {
                    invalid_data(format!(
                        "{LOG_FILE}: group {group} entry {i} lies past the end of the file"
                    ))
                })?;
            out.entry(group, i, buf.len() as u64, size);
            buf.extend_from_slice(record);
        }
    }
    Ok((out, buf))
}

impl LogWriter {
    fn run(mut self, rx: mpsc::Receiver<Job>) {
        loop {
            // With a committed log id waiting, wake up in time to write it even when idle.
            let job = match self.committed_since {
                None => match rx.recv() {
                    Ok(job) => Some(job),
                    Err(_) => break,
                },
                Some(since) => {
                    match rx.recv_timeout(COMMITTED_EVERY.saturating_sub(since.elapsed())) {
                        Ok(job) => Some(job),
                        Err(mpsc::RecvTimeoutError::Timeout) => None,
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                }
            };
            if let Some(job) = job {
                self.take(job);
                // Whatever every group queued meanwhile shares one write and one fsync.
                while let Ok(job) = rx.try_recv() {
                    self.take(job);
                }
            }
            self.flush(false);
        }
        // Closing: write the last committed log ids whatever their age.
        self.flush(true);
    }

    fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some(e) => Err(copy_err(e)),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: io::Error) -> io::Error {
        tracing::error!(dir = %self.dir.display(), "raft log write failed: {e}");
        let copy = copy_err(&e);
        self.failed.get_or_insert(e);
        copy
    }

    /// The offset in the file the next record of this batch will have.
    fn next_offset(&self) -> u64 {
        self.len + self.batch.len() as u64
    }

    /// Adds a job's records to the batch.
    fn take(&mut self, job: Job) {
        if let Err(e) = self.check() {
            match job {
                Job::Append { done, .. } => done.io_completed(Err(e)),
                Job::Committed { .. } => {}
                Job::Vote { done, .. } | Job::Truncate { done, .. } | Job::Purge { done, .. } => {
                    let _ = done.send(Err(e));
                }
            }
            return;
        }
        match job {
            Job::Append {
                group,
                bytes,
                records,
                done,
            } => {
                let mut offset = self.next_offset();
                for (index, size) in records {
                    self.index.entry(group, index, offset, size);
                    offset += size;
                }
                self.batch.extend_from_slice(&bytes);
                self.waiters.push(Waiter::Flushed(done));
            }
            Job::Committed { group, bytes } => {
                self.committed.insert(group, bytes);
                self.committed_since.get_or_insert_with(Instant::now);
            }
            Job::Vote { group, bytes, done } => {
                self.index.vote(group, &bytes);
                self.batch.extend_from_slice(&bytes);
                self.waiters.push(Waiter::Done(done));
            }
            Job::Truncate {
                group,
                bytes,
                after,
                done,
            } => {
                self.index.truncate_after(group, after);
                self.batch.extend_from_slice(&bytes);
                self.waiters.push(Waiter::Done(done));
            }
            Job::Purge {
                group,
                bytes,
                log_id,
                done,
            } => {
                self.index.purge(group, &log_id, &bytes);
                self.batch.extend_from_slice(&bytes);
                self.waiters.push(Waiter::Done(done));
            }
        }
    }

    /// Writes the batch with one write (and one fsync when someone waits for it), then reports
    /// to everyone waiting. Committed log ids ride along with any other change, or go on their
    /// own once they waited `COMMITTED_EVERY`; they go after the batch's entries, so a committed
    /// log id never names an entry missing on disk.
    fn flush(&mut self, closing: bool) {
        let committed_due = closing
            || !self.batch.is_empty()
            || self
                .committed_since
                .is_some_and(|t| t.elapsed() >= COMMITTED_EVERY);
        if committed_due {
            for (group, bytes) in std::mem::take(&mut self.committed) {
                self.index.committed(group, &bytes);
                self.batch.extend_from_slice(&bytes);
            }
            self.committed_since = None;
        }
        if self.batch.is_empty() {
            return;
        }
        // Committed log ids alone need not be durable; the next fsync covers them.
        let sync = self.fsync && (closing || !self.waiters.is_empty());
        let res = self.write_batch(sync);
        for waiter in self.waiters.drain(..) {
            waiter.complete(res.as_ref().map(|_| ()).map_err(copy_err));
        }
        if res.is_ok() {
            self.maybe_compact();
        }
    }

    /// Writes the batch and empties it, whatever the outcome.
    fn write_batch(&mut self, sync: bool) -> io::Result<()> {
        let res = self.check().and_then(|()| {
            let res = self.file.write_all(&self.batch).and_then(|()| {
                if sync {
                    self.file.sync_data()?;
                    self.stats.syncs.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            });
            self.stats.writes.fetch_add(1, Ordering::Relaxed);
            self.len += self.batch.len() as u64;
            res.map_err(|e| self.fail(e))
        });
        self.batch.clear();
        res
    }

    fn maybe_compact(&mut self) {
        if self.background || !self.compaction_due() {
            return;
        }
        let tmp = self.dir.join(LOG_TMP);
        match self.write_compacted(&tmp) {
            Ok(compacted) => self.install_compacted(&tmp, compacted),
            Err(e) => self.compaction_failed(&tmp, e),
        }
    }

    fn compaction_failed(&mut self, tmp: &Path, e: io::Error) {
        // The old file is still whole and valid; compaction is tried again once the file grew
        // by another `COMPACT_MIN_BYTES`, not after every write.
        tracing::warn!(dir = %self.dir.display(), "raft log compaction failed: {e}");
        let _ = fs::remove_file(tmp);
        self.compact_from = self.len.saturating_add(COMPACT_MIN_BYTES);
    }

    /// Writes every group's live records to `tmp`; returns their new index and the new length.
    fn write_compacted(&self, tmp: &Path) -> io::Result<(DiskIndex, u64)> {
        let old = fs::read(self.dir.join(LOG_FILE))?;
        let (index, buf) = live_records(&self.index, &old)?;
        let mut f = File::create(tmp)?;
        f.write_all(&buf)?;
        if self.fsync {
            f.sync_all()?;
        }
        Ok((index, buf.len() as u64))
    }

    /// Whether the file is worth compacting now.
    fn compaction_due(&self) -> bool {
        self.len >= COMPACT_MIN_BYTES.max(self.compact_from)
            && self.index.live_bytes.saturating_mul(2) < self.len
    }

    /// Starts a background compaction: what `write_prefix` needs, taken now.
    fn plan_background(&mut self) -> Option<(PathBuf, DiskIndex, u64)> {
        if self.compacting || !self.compaction_due() || self.check().is_err() {
            return None;
        }
        self.compacting = true;
        Some((self.dir.clone(), self.index.clone(), self.len))
    }

    /// Ends a background compaction: appends what was written since its start to the
    /// compacted prefix, moves the result in place of the log, and carries every record's
    /// place over to the new file.
    fn install_background(&mut self, prefix: io::Result<Prefix>) {
        self.compacting = false;
        let tmp = self.dir.join(COMPACT_TMP);
        let res = prefix.and_then(|p| self.finish_background(&tmp, p));
        match res {
            Ok(None) => {}
            Ok(Some(compacted)) => self.install_compacted(&tmp, compacted),
            Err(e) => self.compaction_failed(&tmp, e),
        }
    }

    /// Copies the records written since the prefix was planned to `tmp` and maps the current
    /// index onto the new file. None: the log failed meanwhile, nothing to install.
    fn finish_background(&self, tmp: &Path, p: Prefix) -> io::Result<Option<(DiskIndex, u64)>> {
        if self.check().is_err() {
            let _ = fs::remove_file(tmp);
            return Ok(None);
        }
        let mut tail = Vec::new();
        {
            use std::io::{Seek, SeekFrom};
            let mut f = File::open(self.dir.join(LOG_FILE))?;
            f.seek(SeekFrom::Start(p.len0))?;
            f.read_to_end(&mut tail)?;
        }
        let tail_len = self.len.saturating_sub(p.len0);
        tail.truncate(usize::try_from(tail_len).unwrap_or(usize::MAX));
        if (tail.len() as u64) != tail_len {
            return Err(invalid_data("raft log shorter than written"));
        }
        let mut index = DiskIndex::default();
        for (&group, g) in &self.index.groups {
            if let Some((log_id, record)) = &g.purged {
                index.purge(group, log_id, record);
            }
            if let Some(record) = &g.vote {
                index.vote(group, record);
            }
            if let Some(record) = &g.committed {
                index.committed(group, record);
            }
            let planned = p.index.groups.get(&group);
            for (&i, &(offset, size)) in &g.entries {
                let at = if offset >= p.len0 {
                    p.len + (offset - p.len0)
                } else {
                    // Written before the plan and still live: the prefix holds it.
                    match planned.and_then(|pg| pg.entries.get(&i)) {
                        Some(&(at, s)) if s == size => at,
                        _ => {
                            return Err(invalid_data(format!(
                                "group {group} entry {i} is missing from the compacted log"
                            )));
                        }
                    }
                };
                index.entry(group, i, at, size);
            }
        }
        let mut f = OpenOptions::new().append(true).open(tmp)?;
        f.write_all(&tail)?;
        Ok(Some((index, p.len + tail_len)))
    }

    fn install_compacted(&mut self, tmp: &Path, (index, len): (DiskIndex, u64)) {
        let path = self.dir.join(LOG_FILE);
        if let Err(e) = fs::rename(tmp, &path) {
            self.compaction_failed(tmp, e);
            return;
        }
        // From here on the old file is gone: failing to sync or reopen leaves nothing valid to
        // append to.
        let reopened = if self.fsync {
            sync_dir(&self.dir)
        } else {
            Ok(())
        }
        .and_then(|()| open_log_file(&path));
        match reopened {
            Ok(file) => {
                tracing::debug!(dir = %self.dir.display(), from = self.len, to = len, "raft log compacted");
                self.file = file;
                self.len = len;
                self.index = index;
            }
            Err(e) => {
                self.fail(e);
            }
        }
    }
}

/// Where the changes go: to the writer thread (with fsync, which must not stall an event
/// loop), or, without fsync, to a writer run on the event loop of whoever queued a change,
/// once that loop's turn is over (a write to the page cache is cheaper than waking a thread).
/// Dropping it writes what is still queued, so a reopened log sees everything.
struct Writer {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    inline: Option<Arc<InlineWriter>>,
}

impl Writer {
    fn send(&self, job: Job) -> io::Result<()> {
        if let Some(w) = &self.inline {
            w.take(job);
            return Ok(());
        }
        self.tx
            .as_ref()
            .ok_or_else(writer_gone)?
            .send(job)
            .map_err(|_| writer_gone())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Some(w) = self.inline.take() {
            w.flush(true);
        }
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The writer without a thread of its own: every change queued during one turn of an event
/// loop (by any group, from any shard) goes out in one write when the turn is over.
struct InlineWriter {
    w: Mutex<LogWriter>,
    /// A flush is on its way at the end of this turn.
    scheduled: std::sync::atomic::AtomicBool,
    /// A flush for committed log ids left alone is on its way.
    timer: std::sync::atomic::AtomicBool,
}

impl InlineWriter {
    fn take(self: &Arc<Self>, job: Job) {
        self.w.lock().unwrap_or_else(|e| e.into_inner()).take(job);
        if !self.scheduled.swap(true, Ordering::AcqRel) {
            self.schedule(Duration::ZERO);
        }
    }

    fn flush_later(self: &Arc<Self>, wait: Duration) {
        if !self.timer.swap(true, Ordering::AcqRel) {
            self.schedule(wait.max(Duration::from_millis(1)));
        }
    }

    /// Flushes after the current turn (or after `delay`) on this thread's event loop; at once
    /// when there is none.
    fn schedule(self: &Arc<Self>, delay: Duration) {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                // Held weakly: a closed log (which wrote everything as it closed) must not
                // stay open, with its directory's lock, until the flush comes round.
                let me = Arc::downgrade(self);
                rt.spawn(async move {
                    if delay.is_zero() {
                        tokio::task::yield_now().await;
                    } else {
                        tokio::time::sleep(delay).await;
                    }
                    if let Some(me) = me.upgrade() {
                        if !delay.is_zero() {
                            me.timer.store(false, Ordering::Release);
                        }
                        me.flush(false);
                    }
                });
            }
            Err(_) => self.flush(true),
        }
    }

    fn flush(self: &Arc<Self>, closing: bool) {
        let mut w = self.w.lock().unwrap_or_else(|e| e.into_inner());
        self.scheduled.store(false, Ordering::Release);
        w.flush(closing);
        let plan = if closing { None } else { w.plan_background() };
        let committed = w.committed_since;
        drop(w);
        if let Some(plan) = plan {
            self.compact_in_background(plan);
        }
        // Committed log ids alone wait a little for company; make sure they get written.
        if let Some(since) = committed {
            self.flush_later(COMMITTED_EVERY.saturating_sub(since.elapsed()));
        }
    }

    /// Copies the live records on a blocking thread, so the event loop goes on appending
    /// meanwhile; only the records written since (the tail) are copied under the lock.
    fn compact_in_background(self: &Arc<Self>, (dir, index, len0): (PathBuf, DiskIndex, u64)) {
        let me = Arc::downgrade(self);
        let work = move || {
            let tmp = dir.join(COMPACT_TMP);
            let prefix = write_prefix(&dir, &tmp, &index, len0);
            match me.upgrade() {
                Some(me) => {
                    me.w.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .install_background(prefix)
                }
                // The log was closed meanwhile.
                None => {
                    let _ = fs::remove_file(&tmp);
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(work);
            }
            Err(_) => work(),
        }
    }
}

type SharedMem = Arc<Mutex<Mem>>;

struct Shared {
    /// Every group's memory, recovered or handed out since; a group's handles share one.
    groups: Mutex<HashMap<GroupId, SharedMem>>,
    /// None keeps everything in memory only.
    writer: Option<Writer>,
    stats: Arc<Stats>,
}

/// The node's Raft log; [`NodeLog::group`] gives each group its log storage. The writer stops
/// once this and every group's handle are dropped.
#[derive(Clone)]
pub struct NodeLog {
    shared: Arc<Shared>,
}

impl NodeLog {
    /// Opens the log kept in `dir`, creating the directory if needed, and recovers every group
    /// saved there; `None` keeps everything in memory. With `fsync`, data is fsynced before an
    /// append is reported flushed and before a vote, truncate or purge returns; without it, data
    /// is handed to the OS, which survives a killed process but not a power loss.
    pub fn open(dir: Option<PathBuf>, fsync: bool) -> io::Result<NodeLog> {
        let stats = Arc::new(Stats::default());
        let Some(dir) = dir else {
            return Ok(NodeLog {
                shared: Arc::new(Shared {
                    groups: Mutex::new(HashMap::new()),
                    writer: None,
                    stats,
                }),
            });
        };
        fs::create_dir_all(&dir)?;
        let lock = lock_dir(&dir)?;
        let path = dir.join(LOG_FILE);
        let created = !path.exists();
        let mut file = open_log_file(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let replayed =
            replay(&bytes).map_err(|e| invalid_data(format!("{}/{e}", dir.display())))?;
        drop(bytes);
        let file_len = file.metadata()?.len();
        if replayed.valid_len < file_len {
            tracing::warn!(
                dir = %dir.display(),
                "dropping {} bytes of a torn record at the end of {LOG_FILE}",
                file_len - replayed.valid_len
            );
            file.set_len(replayed.valid_len)?;
            if fsync {
                file.sync_all()?;
            }
        }
        if created && fsync {
            sync_dir(&dir)?;
        }
        let _ = fs::remove_file(dir.join(LOG_TMP));
        let _ = fs::remove_file(dir.join(COMPACT_TMP));

        let mut writer = LogWriter {
            dir,
            fsync,
            file,
            len: replayed.valid_len,
            index: replayed.index,
            failed: None,
            batch: Vec::new(),
            waiters: Vec::new(),
            committed: BTreeMap::new(),
            committed_since: None,
            compact_from: 0,
            background: false,
            compacting: false,
            stats: stats.clone(),
            _lock: lock,
        };
        writer.maybe_compact();
        writer.check()?;

        let writer = if fsync {
            let (tx, rx) = mpsc::channel();
            let thread = std::thread::Builder::new()
                .name("raft-log".into())
                .spawn(move || writer.run(rx))?;
            Writer {
                tx: Some(tx),
                thread: Some(thread),
                inline: None,
            }
        } else {
            writer.background = true;
            Writer {
                tx: None,
                thread: None,
                inline: Some(Arc::new(InlineWriter {
                    w: Mutex::new(writer),
                    scheduled: std::sync::atomic::AtomicBool::new(false),
                    timer: std::sync::atomic::AtomicBool::new(false),
                })),
            }
        };

        let groups = replayed
            .groups
            .into_iter()
            .map(|(g, mem)| (g, Arc::new(Mutex::new(mem))))
            .collect();
        Ok(NodeLog {
            shared: Arc::new(Shared {
                groups: Mutex::new(groups),
                writer: Some(writer),
                stats,
            }),
        })
    }

    /// The log storage of group `group`: what was recovered for it, or an empty log. Every call
    /// for the same group returns a handle to the same log.
    pub fn group(&self, group: GroupId) -> GroupLog {
        let mem = self
            .shared
            .groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(group)
            .or_default()
            .clone();
        GroupLog {
            group,
            mem,
            shared: self.shared.clone(),
        }
    }

    /// How many writes the writer issued so far: each carries every change queued since the
    /// previous one, whatever group it belongs to.
    pub fn writes(&self) -> u64 {
        self.shared.stats.writes.load(Ordering::Relaxed)
    }

    /// How many fsyncs the writer issued so far (none without fsync).
    pub fn syncs(&self) -> u64 {
        self.shared.stats.syncs.load(Ordering::Relaxed)
    }
}

/// One group's log storage and log reader within the node's log: clones share the same log.
#[derive(Clone)]
pub struct GroupLog {
    group: GroupId,
    mem: SharedMem,
    shared: Arc<Shared>,
}

async fn wait(rx: oneshot::Receiver<io::Result<()>>) -> io::Result<()> {
    rx.await.map_err(|_| writer_gone())?
}

impl GroupLog {
    fn mem(&self) -> MutexGuard<'_, Mem> {
        self.mem.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn writer(&self) -> Option<&Writer> {
        self.shared.writer.as_ref()
    }

    /// Queues a truncate or purge marker after changing memory with `change`, under the lock so
    /// the writer sees this group's jobs in the order its memory changed, and waits for it.
    async fn write_marker(
        &self,
        bytes: Option<Vec<u8>>,
        change: impl FnOnce(&mut Mem),
        job: impl FnOnce(Vec<u8>, oneshot::Sender<io::Result<()>>) -> Job,
    ) -> io::Result<()> {
        let rx = {
            let mut mem = self.mem();
            change(&mut mem);
            match (self.writer(), bytes) {
                (Some(writer), Some(bytes)) => {
                    let (done, rx) = oneshot::channel();
                    writer.send(job(bytes, done))?;
                    Some(rx)
                }
                _ => None,
            }
        };
        match rx {
            Some(rx) => wait(rx).await,
            None => Ok(()),
        }
    }

    /// The encoded record of `change` when there is a disk to write it to.
    fn encode(&self, change: ChangeRef<'_>) -> io::Result<Option<Vec<u8>>> {
        match self.writer() {
            Some(_) => encode_record(self.group, change).map(Some),
            None => Ok(None),
        }
    }
}

/// The inclusive index bounds of `range`, or None when it is empty.
fn index_bounds(range: &impl RangeBounds<u64>) -> Option<(u64, u64)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e,
        Bound::Excluded(&e) => e.checked_sub(1)?,
        Bound::Unbounded => u64::MAX,
    };
    (start <= end).then_some((start, end))
}

impl RaftLogReader<TypeConfig> for GroupLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let Some((start, end)) = index_bounds(&range) else {
            return Ok(Vec::new());
        };
        let mem = self.mem();
        let mut out: Vec<Entry> = Vec::new();
        for (&index, entry) in mem.entries.range(start..=end) {
            if let Some(prev) = out.last()
                && prev.log_id.index + 1 != index
            {
                return Err(invalid_data(format!(
                    "raft log of group {} has a hole between {} and {index}",
                    self.group, prev.log_id.index
                )));
            }
            out.push(entry.clone());
        }
        Ok(out)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.mem().vote)
    }
}

impl RaftLogStorage<TypeConfig> for GroupLog {
    type LogReader = GroupLog;

    async fn get_log_state(&mut self) -> Result<LogState, io::Error> {
        let mem = self.mem();
        let last_log_id = mem.entries.last_key_value().map(|(_, e)| e.log_id);
        Ok(LogState {
            last_purged_log_id: mem.last_purged,
            last_log_id: last_log_id.or(mem.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        if let Some(writer) = self.writer() {
            let (done, rx) = oneshot::channel();
            writer.send(Job::Vote {
                group: self.group,
                bytes: encode_record(self.group, ChangeRef::Vote(vote))?,
                done,
            })?;
            wait(rx).await?;
        }
        // Readers see the vote only once it is durable.
        self.mem().vote = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        let bytes = self.encode(ChangeRef::Committed(committed.as_ref()))?;
        let mut mem = self.mem();
        mem.committed = committed;
        // Not waited for: openraft does not need committed durable on return, and the writer
        // puts it on disk after every entry queued before it.
        if let (Some(writer), Some(bytes)) = (self.writer(), bytes) {
            writer.send(Job::Committed {
                group: self.group,
                bytes,
            })?;
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.mem().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let Some(writer) = self.writer() else {
            let mut mem = self.mem();
            for entry in entries {
                put(&mut mem.entries, entry.log_id.index, entry);
            }
            drop(mem);
            callback.io_completed(Ok(()));
            return Ok(());
        };
        let mut bytes = Vec::new();
        let mut records = Vec::with_capacity(entries.len());
        for entry in &entries {
            let size = push_record(&mut bytes, self.group, ChangeRef::Entry(entry))?;
            records.push((entry.log_id.index, size));
        }
        let mut mem = self.mem();
        for entry in entries {
            put(&mut mem.entries, entry.log_id.index, entry);
        }
        // Queued under the lock, so the writer sees jobs in the order memory changed.
        writer.send(Job::Append {
            group: self.group,
            bytes,
            records,
            done: callback,
        })
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let after = last_log_id.map(|l| l.index);
        let bytes = self.encode(ChangeRef::TruncateAfter(after))?;
        let group = self.group;
        self.write_marker(
            bytes,
            |mem| {
                cut_after(&mut mem.entries, after);
            },
            |bytes, done| Job::Truncate {
                group,
                bytes,
                after,
                done,
            },
        )
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let bytes = self.encode(ChangeRef::Purge(&log_id))?;
        let group = self.group;
        self.write_marker(
            bytes,
            |mem| mem.purge(&log_id),
            |bytes, done| Job::Purge {
                group,
                bytes,
                log_id,
                done,
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn empty_and_reversed_ranges() {
        assert_eq!(index_bounds(&(3..3)), None);
        assert_eq!(index_bounds(&(0..0)), None);
        assert_eq!(index_bounds(&(3..=3)), Some((3, 3)));
        assert_eq!(index_bounds(&(5..)), Some((5, u64::MAX)));
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 7..2;
        assert_eq!(index_bounds(&reversed), None);
    }
}
