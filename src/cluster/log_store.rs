//! A Raft group's durable log storage: the log entries, the vote, the committed log id and the
//! last purged log id, kept in one directory and recovered when the group reopens.
//!
//! Every unpurged entry is held in memory (openraft purges the log after each snapshot, so this
//! stays bounded) and reads never touch the disk. Writes go to disk on a writer thread owned by
//! the store, in the order they were issued, so `append` returns as soon as the entries are in
//! memory and the flush, with its fsync, runs off the async runtime. Appends that queue up while
//! the writer is busy are written and fsynced together.
//!
//! Directory layout:
//!
//! - `log.bin`: append-only records, each `[len: u32 LE][crc: u32 LE][payload]`, where the crc is
//!   CRC-32C over the length bytes and the payload, and the payload is a bincode-encoded
//!   `Record`: an entry, "truncate after index N" or "purge up to log id L". Replaying the
//!   records in order rebuilds the log. When more than half of a file past `COMPACT_MIN_BYTES`
//!   is dead (purged, truncated or overwritten entries and old markers), it is rewritten as the
//!   latest purge marker followed by the live entries, through a temporary file and a rename.
//! - `vote.bin`, `committed.bin`: `[crc: u32 LE][bincode payload]`, replaced atomically by
//!   writing a temporary file and renaming it over the old one.
//!
//! A process killed in the middle of an append leaves a torn last record; replay recognises it
//! (incomplete, or a bad checksum followed only by zeros, as a power loss can leave) and drops
//! it. A bad checksum followed by more data is corruption and opening fails rather than
//! silently forgetting entries that may already be committed.

use crate::cluster::typ::{Entry, LogId, LogState, TypeConfig, Vote};
use openraft::OptionalSend;
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use tokio::sync::oneshot;

const LOG_FILE: &str = "log.bin";
const LOG_TMP: &str = "log.bin.tmp";
const VOTE_FILE: &str = "vote.bin";
const COMMITTED_FILE: &str = "committed.bin";

/// Record header: payload length and checksum.
const HEADER: usize = 8;

/// Below this size the log file is never rewritten: dead records in a small file cost less than
/// copying it.
pub const COMPACT_MIN_BYTES: u64 = 1 << 20;

/// One record of `log.bin`, as decoded on replay.
#[derive(Deserialize)]
enum Record {
    /// An entry; it replaces any entry at its index or above, so the log never has a hole.
    Entry(Entry),
    /// Drops every entry above the index (every entry when None).
    TruncateAfter(Option<u64>),
    /// Drops every entry up to and including the log id's index.
    Purge(LogId),
}

/// The same records as [`Record`], borrowed for encoding; the variants must stay in the same
/// order because bincode identifies a variant by its position.
#[derive(Serialize)]
enum RecordRef<'a> {
    Entry(&'a Entry),
    TruncateAfter(Option<u64>),
    Purge(&'a LogId),
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

const CRC_TABLE: [u32; 256] = crc_table();

/// Table for CRC-32C (Castagnoli, reflected polynomial 0x82F63B78).
const fn crc_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

/// CRC-32C over the concatenation of `parts`.
fn crc32c(parts: &[&[u8]]) -> u32 {
    let mut c = !0u32;
    for part in parts {
        for &b in *part {
            c = CRC_TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
        }
    }
    !c
}

/// Appends one framed record to `out` and returns its size on disk.
fn push_record(out: &mut Vec<u8>, rec: &RecordRef<'_>) -> io::Result<u64> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    bincode::serde::encode_into_std_write(rec, out, bincode_cfg()).map_err(invalid_data)?;
    let payload_len = out.len() - start - HEADER;
    let len = u32::try_from(payload_len).map_err(|_| invalid_data("raft log record over 4 GiB"))?;
    let len_bytes = len.to_le_bytes();
    let crc = crc32c(&[&len_bytes, &out[start + HEADER..]]);
    out[start..start + 4].copy_from_slice(&len_bytes);
    out[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok((out.len() - start) as u64)
}

fn encode_record(rec: &RecordRef<'_>) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    push_record(&mut out, rec)?;
    Ok(out)
}

/// What the bytes at some offset of `log.bin` hold.
enum Frame<'a> {
    Record {
        payload: &'a [u8],
        size: usize,
    },
    /// The end of what a crashed writer managed to write.
    Torn,
    /// A damaged record with more data after it.
    Corrupt,
}

fn read_frame(rest: &[u8]) -> Frame<'_> {
    let Some(&[l0, l1, l2, l3, c0, c1, c2, c3]) = rest.get(..HEADER) else {
        return Frame::Torn;
    };
    let len_bytes = [l0, l1, l2, l3];
    let size = HEADER.saturating_add(u32::from_le_bytes(len_bytes) as usize);
    let Some(payload) = rest.get(HEADER..size) else {
        return Frame::Torn;
    };
    if crc32c(&[&len_bytes, payload]) == u32::from_le_bytes([c0, c1, c2, c3]) {
        return Frame::Record { payload, size };
    }
    // A crash can leave a record whose length made it to disk but whose data did not, padded
    // with zeros up to the file size; anything else after a bad record is real damage.
    if rest.get(size..).unwrap_or_default().iter().all(|&b| b == 0) {
        Frame::Torn
    } else {
        Frame::Corrupt
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

/// The log as readers see it, plus the small pieces of state saved beside it.
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

/// Where the live records sit in `log.bin`, so compaction can copy them without decoding.
#[derive(Default)]
struct DiskIndex {
    live: Locations,
    live_bytes: u64,
    /// The latest purge marker and its framed record, which heads a compacted file.
    purged: Option<(LogId, Vec<u8>)>,
}

impl DiskIndex {
    fn forget(&mut self, removed: Locations) {
        let bytes: u64 = removed.values().map(|&(_, size)| size).sum();
        self.live_bytes = self.live_bytes.saturating_sub(bytes);
    }

    fn entry(&mut self, index: u64, offset: u64, size: u64) {
        let removed = put(&mut self.live, index, (offset, size));
        self.forget(removed);
        self.live_bytes += size;
    }

    fn truncate_after(&mut self, after: Option<u64>) {
        let removed = cut_after(&mut self.live, after);
        self.forget(removed);
    }

    fn purge(&mut self, log_id: &LogId, record: &[u8]) {
        let removed = cut_upto(&mut self.live, log_id.index);
        self.forget(removed);
        if self.purged.as_ref().is_none_or(|(p, _)| p < log_id) {
            self.purged = Some((*log_id, record.to_vec()));
        }
    }
}

/// The result of replaying `log.bin`.
#[derive(Default)]
struct Replayed {
    entries: BTreeMap<u64, Entry>,
    last_purged: Option<LogId>,
    index: DiskIndex,
    /// Bytes up to the end of the last intact record.
    valid_len: u64,
}

fn replay(bytes: &[u8]) -> io::Result<Replayed> {
    let mut out = Replayed::default();
    let mut mem = Mem::default();
    let mut pos = 0usize;
    while let Some(rest) = bytes.get(pos..).filter(|r| !r.is_empty()) {
        let (payload, size) = match read_frame(rest) {
            Frame::Record { payload, size } => (payload, size),
            Frame::Torn => break,
            Frame::Corrupt => {
                return Err(invalid_data(format!(
                    "{LOG_FILE}: damaged record at offset {pos} with data after it"
                )));
            }
        };
        let (record, used): (Record, usize) =
            bincode::serde::decode_from_slice(payload, bincode_cfg())
                .map_err(|e| invalid_data(format!("{LOG_FILE}: record at offset {pos}: {e}")))?;
        if used != payload.len() {
            return Err(invalid_data(format!(
                "{LOG_FILE}: record at offset {pos} has trailing bytes"
            )));
        }
        match record {
            Record::Entry(entry) => {
                let index = entry.log_id.index;
                out.index.entry(index, pos as u64, size as u64);
                put(&mut mem.entries, index, entry);
            }
            Record::TruncateAfter(after) => {
                out.index.truncate_after(after);
                cut_after(&mut mem.entries, after);
            }
            Record::Purge(log_id) => {
                out.index
                    .purge(&log_id, rest.get(..size).unwrap_or_default());
                mem.purge(&log_id);
            }
        }
        pos += size;
    }
    out.entries = mem.entries;
    out.last_purged = mem.last_purged;
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

fn encode_small<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    let payload = bincode::serde::encode_to_vec(value, bincode_cfg()).map_err(invalid_data)?;
    let mut out = Vec::with_capacity(4 + payload.len());
    out.extend_from_slice(&crc32c(&[&payload]).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Reads a file written by [`write_small`]; None when it does not exist.
fn read_small<T: serde::de::DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bad = || invalid_data(format!("{}: damaged", path.display()));
    let Some((crc, payload)) = bytes.split_first_chunk::<4>() else {
        return Err(bad());
    };
    if crc32c(&[payload]) != u32::from_le_bytes(*crc) {
        return Err(bad());
    }
    let (value, _): (T, usize) = bincode::serde::decode_from_slice(payload, bincode_cfg())
        .map_err(|e| invalid_data(format!("{}: {e}", path.display())))?;
    Ok(Some(value))
}

/// Replaces `dir/name` with `bytes`: a reader sees the old or the new content, never a mix.
fn write_small(dir: &Path, name: &str, bytes: &[u8], fsync: bool) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    if fsync {
        f.sync_all()?;
    }
    drop(f);
    fs::rename(&tmp, dir.join(name))?;
    if fsync {
        sync_dir(dir)?;
    }
    Ok(())
}

fn open_log_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
}

/// Work for the writer thread, in issue order.
enum Job {
    Append {
        bytes: Vec<u8>,
        /// (log index, record size) of each entry in `bytes`, in order.
        records: Vec<(u64, u64)>,
        done: IOFlushed<TypeConfig>,
    },
    Committed {
        bytes: Vec<u8>,
    },
    Vote {
        bytes: Vec<u8>,
        done: oneshot::Sender<io::Result<()>>,
    },
    Truncate {
        bytes: Vec<u8>,
        after: Option<u64>,
        done: oneshot::Sender<io::Result<()>>,
    },
    Purge {
        bytes: Vec<u8>,
        log_id: LogId,
        done: oneshot::Sender<io::Result<()>>,
    },
}

/// Owns the files; runs on its own thread.
struct LogWriter {
    dir: PathBuf,
    fsync: bool,
    file: File,
    len: u64,
    index: DiskIndex,
    /// After a failed write the on-disk log no longer matches what openraft was told, so every
    /// later write fails too.
    failed: Option<io::Error>,
    /// Appended records not yet written, and the callbacks waiting for them.
    pending: Vec<u8>,
    pending_done: Vec<IOFlushed<TypeConfig>>,
    /// The latest committed log id not yet written; only the newest one matters.
    pending_committed: Option<Vec<u8>>,
    /// When the committed log id was last written.
    committed_written: Option<std::time::Instant>,
}

/// The committed log id is rewritten at most this often. It only shortens recovery (entries up
/// to it are re-applied at start; later ones are committed again by the leader), so writing it
/// for every batch of entries would cost a file replacement per write for nothing.
const COMMITTED_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

impl LogWriter {
    fn run(mut self, rx: mpsc::Receiver<Job>) {
        loop {
            // With a committed log id waiting, wake up in time to write it even when idle.
            let job = if self.pending_committed.is_some() {
                match rx.recv_timeout(COMMITTED_EVERY) {
                    Ok(job) => Some(job),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match rx.recv() {
                    Ok(job) => Some(job),
                    Err(_) => break,
                }
            };
            if let Some(job) = job {
                self.handle(job);
                // Whatever queued up meanwhile shares one write and one fsync.
                while let Ok(job) = rx.try_recv() {
                    self.handle(job);
                }
            }
            let _ = self.flush();
        }
        // Closing: write the last committed log id whatever its age.
        self.committed_written = None;
        let _ = self.flush();
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

    fn handle(&mut self, job: Job) {
        match job {
            Job::Append {
                bytes,
                records,
                done,
            } => {
                if let Err(e) = self.check() {
                    done.io_completed(Err(e));
                    return;
                }
                let mut offset = self.len + self.pending.len() as u64;
                for (index, size) in records {
                    self.index.entry(index, offset, size);
                    offset += size;
                }
                if self.pending.is_empty() {
                    self.pending = bytes;
                } else {
                    self.pending.extend_from_slice(&bytes);
                }
                self.pending_done.push(done);
            }
            Job::Committed { bytes } => self.pending_committed = Some(bytes),
            Job::Vote { bytes, done } => {
                let res = self.flush().and_then(|()| {
                    write_small(&self.dir, VOTE_FILE, &bytes, self.fsync).map_err(|e| self.fail(e))
                });
                let _ = done.send(res);
            }
            Job::Truncate { bytes, after, done } => {
                let res = self
                    .flush()
                    .and_then(|()| self.write_marker(&bytes))
                    .map(|()| {
                        self.index.truncate_after(after);
                        self.maybe_compact();
                    });
                let _ = done.send(res);
            }
            Job::Purge {
                bytes,
                log_id,
                done,
            } => {
                let res = self
                    .flush()
                    .and_then(|()| self.write_marker(&bytes))
                    .map(|()| {
                        self.index.purge(&log_id, &bytes);
                        self.maybe_compact();
                    });
                let _ = done.send(res);
            }
        }
    }

    /// Writes the pending appends, then the pending committed log id, and reports to the
    /// appends' callbacks. Committed goes second so it never names an entry missing on disk.
    fn flush(&mut self) -> io::Result<()> {
        let res = self.flush_inner();
        for done in self.pending_done.drain(..) {
            done.io_completed(res.as_ref().map(|_| ()).map_err(copy_err));
        }
        res
    }

    fn flush_inner(&mut self) -> io::Result<()> {
        self.check()?;
        if !self.pending.is_empty() {
            let res = self.file.write_all(&self.pending).and_then(|()| {
                if self.fsync {
                    self.file.sync_data()?;
                }
                Ok(())
            });
            self.len += self.pending.len() as u64;
            self.pending.clear();
            res.map_err(|e| self.fail(e))?;
        }
        let due = self
            .committed_written
            .is_none_or(|t| t.elapsed() >= COMMITTED_EVERY);
        if due && let Some(bytes) = self.pending_committed.take() {
            write_small(&self.dir, COMMITTED_FILE, &bytes, self.fsync).map_err(|e| self.fail(e))?;
            self.committed_written = Some(std::time::Instant::now());
        }
        Ok(())
    }

    /// Appends a truncate or purge marker and makes it durable at once.
    fn write_marker(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.check()?;
        let res = self.file.write_all(bytes).and_then(|()| {
            if self.fsync {
                self.file.sync_data()?;
            }
            Ok(())
        });
        self.len += bytes.len() as u64;
        res.map_err(|e| self.fail(e))
    }

    fn maybe_compact(&mut self) {
        if self.len < COMPACT_MIN_BYTES || self.index.live_bytes.saturating_mul(2) >= self.len {
            return;
        }
        let tmp = self.dir.join(LOG_TMP);
        match self.write_compacted(&tmp) {
            Ok(compacted) => self.install_compacted(&tmp, compacted),
            Err(e) => {
                // The old file is still whole and valid; compaction is retried after the next
                // truncate or purge.
                tracing::warn!(dir = %self.dir.display(), "raft log compaction failed: {e}");
                let _ = fs::remove_file(&tmp);
            }
        }
    }

    /// Writes the latest purge marker and the live records to `tmp`; returns the new index and
    /// length.
    fn write_compacted(&self, tmp: &Path) -> io::Result<(Locations, u64)> {
        let old = fs::read(self.dir.join(LOG_FILE))?;
        let mut buf = Vec::with_capacity(self.index.live_bytes as usize + 64);
        if let Some((_, marker)) = &self.index.purged {
            buf.extend_from_slice(marker);
        }
        let mut live = BTreeMap::new();
        for (&index, &(offset, size)) in &self.index.live {
            let record = usize::try_from(offset)
                .ok()
                .zip(usize::try_from(offset + size).ok())
                .and_then(|(from, to)| old.get(from..to))
                .ok_or_else(|| {
                    invalid_data(format!(
                        "{LOG_FILE}: entry {index} lies past the end of the file"
                    ))
                })?;
            live.insert(index, (buf.len() as u64, size));
            buf.extend_from_slice(record);
        }
        let mut f = File::create(tmp)?;
        f.write_all(&buf)?;
        if self.fsync {
            f.sync_all()?;
        }
        Ok((live, buf.len() as u64))
    }

    fn install_compacted(&mut self, tmp: &Path, (live, len): (Locations, u64)) {
        let path = self.dir.join(LOG_FILE);
        if let Err(e) = fs::rename(tmp, &path) {
            tracing::warn!(dir = %self.dir.display(), "raft log compaction failed: {e}");
            let _ = fs::remove_file(tmp);
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
                self.file = file;
                self.len = len;
                self.index.live = live;
            }
            Err(e) => {
                self.fail(e);
            }
        }
    }
}

/// The writer thread and the way to reach it; dropping it lets the thread finish the queued
/// writes and waits for it, so a reopened store sees everything.
struct Writer {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    fn send(&self, job: Job) -> io::Result<()> {
        self.tx
            .as_ref()
            .ok_or_else(writer_gone)?
            .send(job)
            .map_err(|_| writer_gone())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Shared {
    mem: Mutex<Mem>,
    /// None keeps everything in memory only.
    writer: Option<Writer>,
}

/// A Raft group's log store, and its log reader: clones share the same log.
#[derive(Clone)]
pub struct FileLogStore {
    shared: Arc<Shared>,
}

async fn wait(rx: oneshot::Receiver<io::Result<()>>) -> io::Result<()> {
    rx.await.map_err(|_| writer_gone())?
}

impl FileLogStore {
    /// Opens the log kept in `dir`, creating the directory if needed, and recovers what was
    /// saved there; `None` keeps everything in memory. With `fsync`, data is fsynced before an
    /// append is reported flushed and before a vote, truncate or purge returns; without it, data
    /// is handed to the OS, which survives a killed process but not a power loss.
    pub fn open(dir: Option<PathBuf>, fsync: bool) -> io::Result<FileLogStore> {
        let Some(dir) = dir else {
            return Ok(FileLogStore {
                shared: Arc::new(Shared {
                    mem: Mutex::new(Mem::default()),
                    writer: None,
                }),
            });
        };
        fs::create_dir_all(&dir)?;

        let vote: Option<Vote> = read_small(&dir.join(VOTE_FILE))?;
        // Committed is an optimisation openraft can do without (it re-applies from the last
        // snapshot instead), so a damaged file costs time, not safety.
        let committed: Option<LogId> = match read_small::<Option<LogId>>(&dir.join(COMMITTED_FILE))
        {
            Ok(c) => c.flatten(),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                tracing::warn!(dir = %dir.display(), "ignoring committed log id: {e}");
                None
            }
            Err(e) => return Err(e),
        };

        let path = dir.join(LOG_FILE);
        let created = !path.exists();
        let mut file = open_log_file(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let replayed = replay(&bytes)?;
        if replayed.valid_len < bytes.len() as u64 {
            tracing::warn!(
                dir = %dir.display(),
                "dropping {} bytes of a torn record at the end of {LOG_FILE}",
                bytes.len() as u64 - replayed.valid_len
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

        let mut writer = LogWriter {
            dir: dir.clone(),
            fsync,
            file,
            len: replayed.valid_len,
            index: replayed.index,
            failed: None,
            pending: Vec::new(),
            pending_done: Vec::new(),
            pending_committed: None,
            committed_written: None,
        };
        writer.maybe_compact();
        writer.check()?;

        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("raft-log".into())
            .spawn(move || writer.run(rx))?;

        Ok(FileLogStore {
            shared: Arc::new(Shared {
                mem: Mutex::new(Mem {
                    entries: replayed.entries,
                    last_purged: replayed.last_purged,
                    vote,
                    committed,
                }),
                writer: Some(Writer {
                    tx: Some(tx),
                    thread: Some(thread),
                }),
            }),
        })
    }

    fn mem(&self) -> MutexGuard<'_, Mem> {
        self.shared.mem.lock().unwrap_or_else(|e| e.into_inner())
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

impl RaftLogReader<TypeConfig> for FileLogStore {
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
                    "raft log has a hole between {} and {index}",
                    prev.log_id.index
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

impl RaftLogStorage<TypeConfig> for FileLogStore {
    type LogReader = FileLogStore;

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
        if let Some(writer) = &self.shared.writer {
            let (done, rx) = oneshot::channel();
            writer.send(Job::Vote {
                bytes: encode_small(vote)?,
                done,
            })?;
            wait(rx).await?;
        }
        // Readers see the vote only once it is durable.
        self.mem().vote = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        let bytes = match &self.shared.writer {
            Some(_) => Some(encode_small(&committed)?),
            None => None,
        };
        let mut mem = self.mem();
        mem.committed = committed;
        // Not waited for: openraft does not need committed durable on return, and the writer
        // puts it on disk after every entry queued before it.
        if let (Some(writer), Some(bytes)) = (&self.shared.writer, bytes) {
            writer.send(Job::Committed { bytes })?;
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
        let Some(writer) = &self.shared.writer else {
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
            let size = push_record(&mut bytes, &RecordRef::Entry(entry))?;
            records.push((entry.log_id.index, size));
        }
        let mut mem = self.mem();
        for entry in entries {
            put(&mut mem.entries, entry.log_id.index, entry);
        }
        // Queued under the lock, so the writer sees jobs in the order memory changed.
        writer.send(Job::Append {
            bytes,
            records,
            done: callback,
        })
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let after = last_log_id.map(|l| l.index);
        let bytes = match &self.shared.writer {
            Some(_) => Some(encode_record(&RecordRef::TruncateAfter(after))?),
            None => None,
        };
        let rx = {
            let mut mem = self.mem();
            cut_after(&mut mem.entries, after);
            match (&self.shared.writer, bytes) {
                (Some(writer), Some(bytes)) => {
                    let (done, rx) = oneshot::channel();
                    writer.send(Job::Truncate { bytes, after, done })?;
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

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let bytes = match &self.shared.writer {
            Some(_) => Some(encode_record(&RecordRef::Purge(&log_id))?),
            None => None,
        };
        let rx = {
            let mut mem = self.mem();
            mem.purge(&log_id);
            match (&self.shared.writer, bytes) {
                (Some(writer), Some(bytes)) => {
                    let (done, rx) = oneshot::channel();
                    writer.send(Job::Purge {
                        bytes,
                        log_id,
                        done,
                    })?;
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
        push_record(&mut log, &RecordRef::TruncateAfter(Some(3))).unwrap();
        let good = log.len();
        let mut zeros = log.clone();
        zeros.extend_from_slice(&[0; 40]);
        assert_eq!(replay(&zeros).unwrap().valid_len, good as u64);

        let mut damaged = log.clone();
        push_record(&mut damaged, &RecordRef::TruncateAfter(Some(4))).unwrap();
        push_record(&mut damaged, &RecordRef::TruncateAfter(Some(5))).unwrap();
        damaged[good + HEADER] ^= 0x55;
        assert!(replay(&damaged).is_err());
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
