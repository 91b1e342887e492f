//! The writer: the one owner of `log.bin`, on a thread of its own (fsync) or run inline on the
//! event loop that queued the changes; it batches every group's changes into one write, and
//! compacts the file when dead records outweigh live ones.

use super::format::*;
use crate::cluster::typ::{GroupId, LogId, TypeConfig};
use crate::sync::lock;
use openraft::storage::IOFlushed;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Work for the writer thread; a group's jobs arrive in the order its memory changed.
pub(super) enum Job {
    Append {
        group: GroupId,
        /// The records, shared with the entries that keep their encoding.
        bytes: bytes::Bytes,
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
pub(super) enum Waiter {
    Flushed(IOFlushed<TypeConfig>),
    Done(oneshot::Sender<io::Result<()>>),
}

impl Waiter {
    pub(super) fn complete(self, res: io::Result<()>) {
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
pub(super) struct Stats {
    pub(super) writes: AtomicU64,
    pub(super) syncs: AtomicU64,
}

/// Owns the file; runs on its own thread.
pub(super) struct LogWriter {
    pub(super) dir: PathBuf,
    pub(super) fsync: bool,
    pub(super) file: File,
    pub(super) len: u64,
    pub(super) index: DiskIndex,
    /// After a failed write the on-disk log no longer matches what openraft was told, so every
    /// later write fails too.
    pub(super) failed: Option<io::Error>,
    /// The records of this batch, and who waits for them.
    pub(super) batch: Vec<u8>,
    pub(super) waiters: Vec<Waiter>,
    /// The latest committed log id of each group not yet written (only the newest one
    /// matters), and since when the oldest of them waits.
    pub(super) committed: BTreeMap<GroupId, Vec<u8>>,
    pub(super) committed_since: Option<Instant>,
    /// No compaction is tried before the file reaches this size again after one failed.
    pub(super) compact_from: u64,
    /// Compaction runs in the background (the writer runs on an event loop): it must not
    /// be run inline, and one is under way.
    pub(super) background: bool,
    pub(super) compacting: bool,
    pub(super) stats: Arc<Stats>,
    /// Holds the directory's lock while the writer runs.
    pub(super) _lock: File,
}

/// The first part of a background compaction: the live records of the file's first `len0`
/// bytes, written to `COMPACT_TMP`, and where each landed; then the bytes appended after
/// `len0`, copied as they are, up to `copied_to`.
pub(super) struct Prefix {
    pub(super) index: DiskIndex,
    pub(super) len: u64,
    pub(super) len0: u64,
    pub(super) copied_to: u64,
}

/// Writes the live records (by `index`) of the log to `tmp`, synced to disk if `sync`; returns
/// where each landed and the new file's length.
///
/// Only the live records are read, as a few ranges: the rest (entries purged since the last
/// compaction) is most of the file, and an idle group's old records would otherwise make the
/// read start near the file's beginning.
fn write_live(
    dir: &Path,
    tmp: &Path,
    index: &DiskIndex,
    sync: bool,
) -> io::Result<(DiskIndex, u64)> {
    let old = LiveBytes::read(dir, index)?;
    let (index, bytes) = live_records(index, &old)?;
    let mut f = File::create(tmp)?;
    f.write_all(&bytes)?;
    if sync {
        f.sync_all()?;
    }
    Ok((index, bytes.len() as u64))
}

/// Writes the live records (by `index`) of the first `len0` bytes of the log to `tmp`.
pub(super) fn write_prefix(
    dir: &Path,
    tmp: &Path,
    index: &DiskIndex,
    len0: u64,
) -> io::Result<Prefix> {
    let (index, len) = write_live(dir, tmp, index, false)?;
    Ok(Prefix {
        index,
        len,
        len0,
        copied_to: len0,
    })
}

/// Appends to `tmp` what the log holds from `p.copied_to` to `to`, as it is. Those bytes are
/// whole records written before `to` was read under the writer's lock, and the file only
/// grows until the compaction replaces it, so this runs without the lock: what the lock must
/// cover at the end is then only what was appended meanwhile. The kernel copies them from
/// file to file (`copy_file_range`), without passing them through this process.
pub(super) fn catch_up(dir: &Path, tmp: &Path, p: &mut Prefix, to: u64) -> io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    if to <= p.copied_to {
        return Ok(());
    }
    let want = to - p.copied_to;
    let mut src = File::open(dir.join(LOG_FILE))?;
    src.seek(SeekFrom::Start(p.copied_to))?;
    // Not opened to append: the kernel refuses to copy into a file opened so.
    let mut f = OpenOptions::new().write(true).open(tmp)?;
    f.seek(SeekFrom::End(0))?;
    if io::copy(&mut src.take(want), &mut f)? != want {
        return Err(invalid_data("raft log shorter than written"));
    }
    p.copied_to = to;
    Ok(())
}

/// Live entries this close together in the file are read in one go.
const READ_GAP: u64 = 64 << 10;

/// Parts of the log file, each held from its offset on: where its live records lie.
struct LiveBytes {
    /// By offset, not overlapping.
    parts: Vec<(u64, Vec<u8>)>,
}

impl LiveBytes {
    /// Reads the ranges of the file that hold the entries `index` places in it.
    fn read(dir: &Path, index: &DiskIndex) -> io::Result<LiveBytes> {
        use std::os::unix::fs::FileExt;
        let mut spans: Vec<(u64, u64)> = index
            .groups
            .values()
            .flat_map(|g| g.entries.values())
            .map(|&(offset, size)| (offset, offset.saturating_add(size)))
            .collect();
        spans.sort_unstable();
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for (from, to) in spans {
            match ranges.last_mut() {
                Some(last) if from <= last.1.saturating_add(READ_GAP) => last.1 = last.1.max(to),
                _ => ranges.push((from, to)),
            }
        }
        let f = File::open(dir.join(LOG_FILE))?;
        let mut parts = Vec::with_capacity(ranges.len());
        for (from, to) in ranges {
            let len =
                usize::try_from(to - from).map_err(|_| invalid_data("raft log range too large"))?;
            let mut buf = vec![0; len];
            f.read_exact_at(&mut buf, from).map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    invalid_data("raft log shorter than written")
                } else {
                    e
                }
            })?;
            parts.push((from, buf));
        }
        Ok(LiveBytes { parts })
    }

    /// The `size` bytes at `offset`, if they were read.
    fn get(&self, offset: u64, size: u64) -> Option<&[u8]> {
        let i = self
            .parts
            .partition_point(|(at, _)| *at <= offset)
            .checked_sub(1)?;
        let (at, bytes) = self.parts.get(i)?;
        let from = usize::try_from(offset - at).ok()?;
        let to = from.checked_add(usize::try_from(size).ok()?)?;
        bytes.get(from..to)
    }
}

/// Every group's live records, as `index` places them in `old`, laid out afresh: the bytes
/// and their index.
fn live_records(index: &DiskIndex, old: &LiveBytes) -> io::Result<(DiskIndex, Vec<u8>)> {
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
            let record = old.get(offset, size).ok_or_else(|| {
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
    pub(super) fn run(mut self, rx: mpsc::Receiver<Job>) {
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

    pub(super) fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some(e) => Err(copy_err(e)),
            None => Ok(()),
        }
    }

    pub(super) fn fail(&mut self, e: io::Error) -> io::Error {
        tracing::error!(dir = %self.dir.display(), "raft log write failed: {e}");
        let copy = copy_err(&e);
        self.failed.get_or_insert(e);
        copy
    }

    /// The offset in the file the next record of this batch will have.
    pub(super) fn next_offset(&self) -> u64 {
        self.len + self.batch.len() as u64
    }

    /// Adds a job's records to the batch.
    pub(super) fn take(&mut self, job: Job) {
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
    pub(super) fn flush(&mut self, closing: bool) {
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
    pub(super) fn write_batch(&mut self, sync: bool) -> io::Result<()> {
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

    pub(super) fn maybe_compact(&mut self) {
        if self.background || !self.compaction_due() {
            return;
        }
        let tmp = self.dir.join(LOG_TMP);
        match self.write_compacted(&tmp) {
            Ok(compacted) => self.install_compacted(&tmp, compacted),
            Err(e) => self.compaction_failed(&tmp, e),
        }
    }

    pub(super) fn compaction_failed(&mut self, tmp: &Path, e: io::Error) {
        // The old file is still whole and valid; compaction is tried again once the file grew
        // by another `COMPACT_MIN_BYTES`, not after every write.
        tracing::warn!(dir = %self.dir.display(), "raft log compaction failed: {e}");
        let _ = fs::remove_file(tmp);
        self.compact_from = self.len.saturating_add(COMPACT_MIN_BYTES);
    }

    /// Writes every group's live records to `tmp`; returns their new index and the new length.
    pub(super) fn write_compacted(&self, tmp: &Path) -> io::Result<(DiskIndex, u64)> {
        write_live(&self.dir, tmp, &self.index, self.fsync)
    }

    /// Whether the file is worth compacting now.
    pub(super) fn compaction_due(&self) -> bool {
        self.len >= COMPACT_MIN_BYTES.max(self.compact_from)
            && self.index.live_bytes.saturating_mul(COMPACT_RATIO) < self.len
    }

    /// Starts a background compaction: what `write_prefix` needs, taken now.
    pub(super) fn plan_background(&mut self) -> Option<(PathBuf, DiskIndex, u64)> {
        if self.compacting || !self.compaction_due() || self.check().is_err() {
            return None;
        }
        self.compacting = true;
        Some((self.dir.clone(), self.index.clone(), self.len))
    }

    /// Ends a background compaction: appends what was written since its start to the
    /// compacted prefix, moves the result in place of the log, and carries every record's
    /// place over to the new file.
    pub(super) fn install_background(&mut self, prefix: io::Result<Prefix>) {
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
    pub(super) fn finish_background(
        &self,
        tmp: &Path,
        mut p: Prefix,
    ) -> io::Result<Option<(DiskIndex, u64)>> {
        if self.check().is_err() {
            let _ = fs::remove_file(tmp);
            return Ok(None);
        }
        // The records written since the last catch-up; then the new file is the prefix and
        // everything from `len0` on, as it was.
        catch_up(&self.dir, tmp, &mut p, self.len)?;
        let len = p.len + (self.len - p.len0);
        if fs::metadata(tmp)?.len() != len {
            return Err(invalid_data("compacted raft log is not as long as planned"));
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
        Ok(Some((index, len)))
    }

    pub(super) fn install_compacted(&mut self, tmp: &Path, (index, len): (DiskIndex, u64)) {
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
                let old = std::mem::replace(&mut self.file, file);
                self.len = len;
                // The old file was only unlinked by the rename: closing its last handle frees
                // its blocks and drops its pages from the cache, which for a large log takes
                // long enough to stall the event loop: a blocking thread does it.
                let old_index = std::mem::replace(&mut self.index, index);
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => {
                        rt.spawn_blocking(move || drop((old, old_index)));
                    }
                    Err(_) => drop((old, old_index)),
                }
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
pub(super) struct Writer {
    pub(super) tx: Option<mpsc::Sender<Job>>,
    pub(super) thread: Option<JoinHandle<()>>,
    pub(super) inline: Option<Arc<InlineWriter>>,
}

impl Writer {
    pub(super) fn send(&self, job: Job) -> io::Result<()> {
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
pub(super) struct InlineWriter {
    pub(super) w: Mutex<LogWriter>,
    /// A flush is on its way at the end of this turn.
    pub(super) scheduled: std::sync::atomic::AtomicBool,
    /// A flush for committed log ids left alone is on its way.
    pub(super) timer: std::sync::atomic::AtomicBool,
}

impl InlineWriter {
    pub(super) fn take(self: &Arc<Self>, job: Job) {
        lock(&self.w).take(job);
        if !self.scheduled.swap(true, Ordering::AcqRel) {
            self.schedule(Duration::ZERO);
        }
    }

    pub(super) fn flush_later(self: &Arc<Self>, wait: Duration) {
        if !self.timer.swap(true, Ordering::AcqRel) {
            self.schedule(wait.max(Duration::from_millis(1)));
        }
    }

    /// Flushes after the current turn (or after `delay`) on this thread's event loop; at once
    /// when there is none.
    pub(super) fn schedule(self: &Arc<Self>, delay: Duration) {
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

    pub(super) fn flush(self: &Arc<Self>, closing: bool) {
        let mut w = lock(&self.w);
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
    /// meanwhile, then what was appended while they were copied; only the records written
    /// after that (the tail) are copied under the lock, on the event loop. The lock is never
    /// held by the blocking thread for longer than it takes to read the log's length: a
    /// thread preempted while holding it would stall the loop that appends.
    pub(super) fn compact_in_background(
        self: &Arc<Self>,
        (dir, index, len0): (PathBuf, DiskIndex, u64),
    ) {
        let me = Arc::downgrade(self);
        let prepare = move |me: &std::sync::Weak<InlineWriter>| {
            let tmp = dir.join(COMPACT_TMP);
            let prefix = write_prefix(&dir, &tmp, &index, len0).and_then(|mut p| {
                // Twice at most: each pass copies what was appended while the one before ran.
                for _ in 0..2 {
                    let Some(to) = me.upgrade().map(|me| lock(&me.w).len) else {
                        break;
                    };
                    catch_up(&dir, &tmp, &mut p, to)?;
                }
                Ok(p)
            });
            (tmp, prefix)
        };
        let install = |me: &std::sync::Weak<InlineWriter>, tmp: PathBuf, prefix| match me.upgrade()
        {
            Some(me) => lock(&me.w).install_background(prefix),
            // The log was closed meanwhile.
            None => {
                let _ = fs::remove_file(&tmp);
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                // A thread of its own, at a lower priority: on a busy machine the copy (tens of
                // MB read and written) would otherwise take its share of a core from the event
                // loops, and every replica of a group compacts at about the same time.
                let spawned = std::thread::Builder::new()
                    .name("bucketd-compact".into())
                    .spawn(move || {
                        lower_priority();
                        let (tmp, prefix) = prepare(&me);
                        rt.spawn(async move { install(&me, tmp, prefix) });
                    });
                if let Err(e) = spawned {
                    tracing::warn!("log compaction not started: {e}");
                    lock(&self.w).install_background(Err(e));
                }
            }
            Err(_) => {
                let (tmp, prefix) = prepare(&me);
                install(&me, tmp, prefix);
            }
        }
    }
}

/// Lowers the calling thread's scheduling priority (nice 10), for background work that
/// must not slow the event loops down.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority take no pointers; on Linux a thread id names one thread
    // for PRIO_PROCESS, so only the calling thread is affected.
    unsafe {
        let tid = libc::gettid();
        let _ = libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

#[cfg(test)]
mod tests;
