//! openraft's log storage over the shared file: [`NodeLog`] opens the log and hands out each
//! group's [`GroupLog`], which keeps the group's entries in memory and queues its changes for
//! the writer.

use super::format::*;
use super::writer::*;
use crate::cluster::entry_decode::decoded;
use crate::cluster::typ::{Entry, GroupId, LogId, LogState, TypeConfig, Vote};
use crate::cluster::typ::{keep_bytes_only, set_wire, wire_of};
use crate::sync::lock;
use openraft::OptionalSend;
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::fs;
use std::io::{self, Read};
use std::ops::{Bound, RangeBounds};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use tokio::sync::oneshot;

pub(super) type SharedMem = Arc<Mutex<Mem>>;

pub(super) struct Shared {
    /// Every group's memory, recovered or handed out since; a group's handles share one.
    pub(super) groups: Mutex<HashMap<GroupId, SharedMem>>,
    /// None keeps everything in memory only.
    pub(super) writer: Option<Writer>,
    pub(super) stats: Arc<Stats>,
    /// What every group's entries held in memory weigh together (see `Mem::bytes`).
    pub(super) mem_bytes: AtomicU64,
}

/// The node's Raft log; [`NodeLog::group`] gives each group its log storage. The writer stops
/// once this and every group's handle are dropped.
#[derive(Clone)]
pub struct NodeLog {
    pub(super) shared: Arc<Shared>,
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
                    mem_bytes: AtomicU64::new(0),
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

        let mem_bytes = replayed.groups.values().map(|m| m.bytes).sum();
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
                mem_bytes: AtomicU64::new(mem_bytes),
            }),
        })
    }

    /// The log storage of group `group`: what was recovered for it, or an empty log. Every call
    /// for the same group returns a handle to the same log.
    pub fn group(&self, group: GroupId) -> GroupLog {
        let mem = lock(&self.shared.groups).entry(group).or_default().clone();
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

    /// What the entries held in memory weigh over every group: the size of their records on
    /// disk (nothing for a log kept only in memory).
    pub fn mem_bytes(&self) -> u64 {
        self.shared.mem_bytes.load(Ordering::Relaxed)
    }
}

/// One group's log storage and log reader within the node's log: clones share the same log.
#[derive(Clone)]
pub struct GroupLog {
    pub(super) group: GroupId,
    pub(super) mem: SharedMem,
    pub(super) shared: Arc<Shared>,
}

pub(super) async fn wait(rx: oneshot::Receiver<io::Result<()>>) -> io::Result<()> {
    rx.await.map_err(|_| writer_gone())?
}

/// About how many bytes `entry`'s record takes, so that a turn's records are encoded into one
/// buffer made once rather than regrown by doubling.
fn record_guess(entry: &Entry) -> usize {
    /// Header, group, log id and the proposal's fields but its commands.
    const FIXED: usize = 64;
    /// A rate-limit check: its variant, a key of 20 to 40 bytes and its arguments.
    const PER_COMMAND: usize = 48;
    match &entry.payload {
        openraft::EntryPayload::Normal(p) => match &p.wire.0 {
            Some(w) => FIXED + w.len(),
            None => FIXED + p.cmds.len().saturating_mul(PER_COMMAND),
        },
        _ => FIXED,
    }
}

impl GroupLog {
    pub(super) fn mem(&self) -> MutexGuard<'_, Mem> {
        lock(&self.mem)
    }

    /// Changes this group's memory with `change`, keeping the node's total weight in step.
    pub(super) fn change<R>(&self, mem: &mut Mem, change: impl FnOnce(&mut Mem) -> R) -> R {
        let before = mem.bytes;
        let r = change(mem);
        let after = mem.bytes;
        let total = &self.shared.mem_bytes;
        if after >= before {
            total.fetch_add(after - before, Ordering::Relaxed);
        } else {
            total.fetch_sub(before - after, Ordering::Relaxed);
        }
        r
    }

    /// What this group's entries held in memory weigh (see `NodeLog::mem_bytes`).
    pub fn mem_bytes(&self) -> u64 {
        self.mem().bytes
    }

    pub(super) fn writer(&self) -> Option<&Writer> {
        self.shared.writer.as_ref()
    }

    /// Queues a truncate or purge marker after changing memory with `change`, under the lock so
    /// the writer sees this group's jobs in the order its memory changed, and waits for it.
    pub(super) async fn write_marker(
        &self,
        bytes: Option<Vec<u8>>,
        change: impl FnOnce(&mut Mem),
        job: impl FnOnce(Vec<u8>, oneshot::Sender<io::Result<()>>) -> Job,
    ) -> io::Result<()> {
        let rx = {
            let mut mem = self.mem();
            self.change(&mut mem, change);
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
    pub(super) fn encode(&self, change: ChangeRef<'_>) -> io::Result<Option<Vec<u8>>> {
        match self.writer() {
            Some(_) => encode_record(self.group, change).map(Some),
            None => Ok(None),
        }
    }
}

/// The inclusive index bounds of `range`, or None when it is empty.
pub(super) fn index_bounds(range: &impl RangeBounds<u64>) -> Option<(u64, u64)> {
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

impl GroupLog {
    /// The entries held from `start` to `end` (both included), as held; with `drop_decoded`,
    /// those that carry their encoding keep only that from now on.
    fn held(&self, start: u64, end: u64, drop_decoded: bool) -> Result<Vec<Entry>, io::Error> {
        let mut mem = self.mem();
        let mut out: Vec<Entry> = Vec::new();
        for (&index, Held { entry, .. }) in mem.entries.range_mut(start..=end) {
            if let Some(prev) = out.last()
                && prev.log_id.index + 1 != index
            {
                return Err(invalid_data(format!(
                    "raft log of group {} has a hole between {} and {index}",
                    self.group, prev.log_id.index
                )));
            }
            out.push(entry.clone());
            if drop_decoded {
                keep_bytes_only(entry);
            }
        }
        Ok(out)
    }
}

impl RaftLogReader<TypeConfig> for GroupLog {
    /// This is how the state machine reads what it applies: an entry read here is then held
    /// as its encoding alone, when it has one, and decoded from it should it be read here
    /// again.
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let Some((start, end)) = index_bounds(&range) else {
            return Ok(Vec::new());
        };
        let held = self.held(start, end, true)?;
        held.into_iter().map(decoded).collect()
    }

    /// What replication reads: entries as they are held, since an append sends an entry's
    /// encoding (which a follower's entries always keep), not its decoded commands.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, io::Error> {
        match end.checked_sub(1) {
            Some(last) if start <= last => self.held(start, last, false),
            _ => Ok(Vec::new()),
        }
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.mem().vote)
    }
}

impl RaftLogStorage<TypeConfig> for GroupLog {
    type LogReader = GroupLog;

    async fn get_log_state(&mut self) -> Result<LogState, io::Error> {
        let mem = self.mem();
        let last_log_id = mem.entries.last_key_value().map(|(_, h)| h.entry.log_id);
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
        let mut entries: Vec<Entry> = entries.into_iter().collect();
        let Some(writer) = self.writer() else {
            let mut mem = self.mem();
            self.change(&mut mem, |mem| {
                for entry in entries {
                    mem.put(entry, 0);
                }
            });
            drop(mem);
            callback.io_completed(Ok(()));
            return Ok(());
        };
        let mut bytes = Vec::with_capacity(entries.iter().map(record_guess).sum());
        let mut records = Vec::with_capacity(entries.len());
        let mut spans = Vec::with_capacity(entries.len());
        for entry in &entries {
            let (size, span) =
                push_record_spanned(&mut bytes, self.group, ChangeRef::Entry(entry))?;
            records.push((entry.log_id.index, size));
            spans.push(span);
        }
        // The leader's own entries keep their encoding for the appends to its followers: a
        // view into the records just written, not a copy (an entry that arrived with its
        // bytes keeps those).
        let bytes = bytes::Bytes::from(bytes);
        for (entry, span) in entries.iter_mut().zip(spans) {
            if wire_of(entry).is_none()
                && let Some(span) = span
                && span.len() <= WIRE_KEEP
                && span.end <= bytes.len()
            {
                set_wire(entry, Some(bytes.slice(span)));
            }
        }
        let mut mem = self.mem();
        self.change(&mut mem, |mem| {
            for (entry, &(_, size)) in entries.into_iter().zip(&records) {
                mem.put(entry, size);
            }
        });
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
            |mem| mem.truncate_after(after),
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
    use crate::cluster::typ::{Proposal, is_bytes_only};
    use crate::cmd::KeyCmd;
    use openraft::entry::RaftEntry;
    use openraft::type_config::TypeConfigExt;

    fn encoded(e: &Entry) -> Vec<u8> {
        bincode::serde::encode_to_vec(e, bincode::config::standard()).unwrap()
    }

    /// Once the state machine has read an entry that carries its encoding, the log holds it
    /// as that alone: replication reads it so, another read decodes it whole again, and after
    /// a restart it comes back whole from disk.
    #[tokio::test]
    async fn entries_read_to_be_applied_are_held_as_their_bytes() {
        let dir = std::env::temp_dir().join(format!(
            "bucketd-held-bytes-{}-{}",
            std::process::id(),
            line!()
        ));
        let _ = fs::remove_dir_all(&dir);
        let mut entries: Vec<Entry> = (1..=3u64)
            .map(|i| {
                let key = bytes::Bytes::from(format!("bucket:{{t}}:{i}"));
                let cmds = vec![KeyCmd::IncrBy {
                    key,
                    delta: i as i64,
                }];
                let id = openraft::testing::log_id::<TypeConfig>(2, 1, i);
                Entry::new_normal(id, Proposal::new(i * 10, None, cmds))
            })
            .collect();
        let sent: Vec<Vec<u8>> = entries.iter().map(encoded).collect();
        // As a follower's entries arrive: with the bytes they came in.
        for (e, b) in entries.iter_mut().zip(&sent) {
            set_wire(e, Some(b.clone().into()));
        }
        {
            let log = NodeLog::open(Some(dir.clone()), false).unwrap();
            let mut g = log.group(0);
            let (tx, rx) = TypeConfig::oneshot();
            g.append(entries, IOFlushed::signal(tx)).await.unwrap();
            rx.await.unwrap().unwrap();

            let before = g.limited_get_log_entries(1, 4).await.unwrap();
            assert!(before.iter().all(|e| !is_bytes_only(e)));
            for round in 0..2 {
                let whole = g.try_get_log_entries(1..=3).await.unwrap();
                assert_eq!(whole.len(), 3);
                for (e, bytes) in whole.iter().zip(&sent) {
                    assert!(!is_bytes_only(e));
                    assert_eq!(&encoded(e), bytes, "read {round}");
                }
                let as_held = g.limited_get_log_entries(1, 4).await.unwrap();
                assert_eq!(as_held.len(), 3);
                for (e, bytes) in as_held.iter().zip(&sent) {
                    assert!(is_bytes_only(e));
                    assert_eq!(wire_of(e).map(|w| w.to_vec()).as_ref(), Some(bytes));
                }
            }
        }
        let log = NodeLog::open(Some(dir.clone()), false).unwrap();
        let again = log.group(0).try_get_log_entries(..).await.unwrap();
        let again: Vec<Vec<u8>> = again.iter().map(encoded).collect();
        assert_eq!(again, sent);
        drop(log);
        let _ = fs::remove_dir_all(&dir);
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
