//! A Raft group's state machine: committed proposals are applied to the keys of the group's
//! slots, on the shard thread that owns them, at the time the leader stamped on the entry.
//!
//! Applying is deterministic: every replica sees the same entries in the same order with the
//! same timestamps, so every replica computes the same buckets. Time never runs backward inside
//! the group: a batch is applied at `max(stamp, last applied stamp)`, so a new leader whose
//! clock is behind cannot refund tokens.
//!
//! The applied state itself is volatile (it lives in the shard's store); snapshots are written
//! to disk, and on restart openraft installs the last snapshot and re-applies the committed log
//! after it.

use crate::cluster::group_time::GroupClocks;
use crate::cluster::typ::{
    Applied, GroupId, GroupSnapshot, LogId, Origin, SnapshotMeta, StoredMembership, TypeConfig,
};
use crate::cmd::{KeyCmd, Reply};
use crate::store::Record;
use crate::sync::lock;
use futures_util::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine, Snapshot};

use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// One committed entry's commands, with the time they apply at.
#[derive(Debug)]
pub struct EntryBatch {
    /// The group whose entry it is.
    pub group: GroupId,
    pub now: u64,
    pub origin: Option<Origin>,
    pub cmds: Arc<Vec<KeyCmd>>,
    /// Whether anyone waits for the replies through Raft: only the replica that proposed the
    /// entry does; on the others the commands are applied and their replies dropped.
    pub wanted: bool,
}

/// Where a group's keys live and how commands reach them.
pub trait Executor: Send + Sync + 'static {
    /// Applies batches of commands in order, each at its own time. Per batch: one reply per
    /// command, or none when the batch's origin answered its clients itself.
    fn apply(
        &self,
        batches: Vec<EntryBatch>,
    ) -> impl Future<Output = io::Result<Vec<Vec<Reply>>>> + Send;
    /// Copies out the group's keys.
    fn export(&self, now: u64) -> impl Future<Output = io::Result<Vec<Record>>> + Send;
    /// Replaces the group's keys with `records`.
    fn import(&self, records: Vec<Record>) -> impl Future<Output = io::Result<()>> + Send;
}

/// What a snapshot holds besides the keys.
///
/// On-disk format: bincode-encoded into snapshots (golden bytes in tests/encoding.rs).
/// Fields never move or change type; changes are append-only (a new variant of the enum that
/// carries it) or take a new format version.
#[derive(Serialize, Deserialize)]
pub struct SnapshotBody {
    /// The group time of the last applied entry.
    pub last_ts: u64,
    pub records: Vec<Record>,
}

/// On-disk format: bincode-encoded into snapshots (golden bytes in tests/encoding.rs).
/// Fields never move or change type; changes are append-only (a new variant of the enum that
/// carries it) or take a new format version.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

fn bincode_cfg() -> bincode::config::Configuration {
    bincode::config::standard()
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Progress shared by the state machine and its snapshot builders.
#[derive(Default)]
struct Progress {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    /// The latest stamp applied: time inside the group never goes below it.
    last_ts: u64,
    current: Option<(SnapshotMeta, Vec<u8>)>,
}

pub struct GroupStateMachine<E: Executor> {
    exec: Arc<E>,
    progress: Arc<Mutex<Progress>>,
    /// Directory for the snapshot file; None keeps snapshots in memory only (tests).
    dir: Option<PathBuf>,
    /// The group, and the node's group clocks that every applied entry's time raises.
    time: Option<(GroupId, Arc<GroupClocks>)>,
}

impl<E: Executor> GroupStateMachine<E> {
    /// Opens the state machine, loading the last snapshot from `dir` if there is one.
    pub fn open(exec: Arc<E>, dir: Option<PathBuf>) -> io::Result<Self> {
        let mut progress = Progress::default();
        if let Some(d) = &dir {
            std::fs::create_dir_all(d)?;
            let path = d.join("snapshot.bin");
            if path.exists() {
                let bytes = std::fs::read(&path)?;
                let (file, _): (SnapshotFile, usize) =
                    crate::cluster::decode_bounded(&bytes).map_err(io_err)?;
                progress.current = Some((file.meta, file.data));
            }
        }
        Ok(GroupStateMachine {
            exec,
            progress: Arc::new(Mutex::new(progress)),
            dir,
            time: None,
        })
    }

    /// Keeps group `g`'s time on this node: every entry applied, and the snapshot found at
    /// start, raise it.
    pub(crate) fn keeping_time(mut self, g: GroupId, clocks: Arc<GroupClocks>) -> Self {
        let snapshot_ts = lock(&self.progress)
            .current
            .as_ref()
            .and_then(|(_, data)| snapshot_time(data));
        if let Some(ts) = snapshot_ts {
            clocks.observe(g, ts);
        }
        self.time = Some((g, clocks));
        self
    }

    fn group(&self) -> GroupId {
        self.time.as_ref().map_or(0, |(g, _)| *g)
    }

    fn observe(&self, ts: u64) {
        if let Some((g, clocks)) = &self.time {
            clocks.observe(*g, ts);
        }
    }
}

/// The group time a snapshot's body was taken at: its first field, read without decoding the
/// keys.
fn snapshot_time(data: &[u8]) -> Option<u64> {
    bincode::serde::decode_from_slice::<u64, _>(data, bincode_cfg())
        .ok()
        .map(|(ts, _)| ts)
}

/// A snapshot's content, taken between two applies; building only encodes and stores it.
pub struct GroupSnapshotBuilder<E: Executor> {
    progress: Arc<Mutex<Progress>>,
    dir: Option<PathBuf>,
    meta: SnapshotMeta,
    /// The copied keys, or why they could not be copied (then no snapshot is made).
    body: Result<SnapshotBody, io::Error>,
    _exec: std::marker::PhantomData<E>,
}

impl<E: Executor> RaftSnapshotBuilder<TypeConfig> for GroupSnapshotBuilder<E> {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<GroupSnapshot, io::Error> {
        let body = match &mut self.body {
            Ok(b) => SnapshotBody {
                last_ts: b.last_ts,
                records: std::mem::take(&mut b.records),
            },
            Err(e) => return Err(io::Error::other(format!("snapshot export failed: {e}"))),
        };
        // Encoding a large group and writing it to disk (with an fsync) takes long: off the
        // event loop, which also runs the group's Raft and serves clients.
        let meta = self.meta.clone();
        let progress = self.progress.clone();
        let dir = self.dir.clone();
        let stored = meta.clone();
        let data = tokio::task::spawn_blocking(move || {
            let data = bincode::serde::encode_to_vec(&body, bincode_cfg()).map_err(io_err)?;
            store_snapshot(&progress, dir.as_deref(), &stored, &data)?;
            Ok::<_, io::Error>(data)
        })
        .await
        .map_err(io_err)??;
        Ok(Snapshot {
            meta,
            snapshot: data,
        })
    }
}

/// Makes `(meta, data)` the current snapshot, on disk first, unless a newer one is already
/// current (a snapshot installed from the leader while this one was being built).
fn store_snapshot(
    progress: &Mutex<Progress>,
    dir: Option<&std::path::Path>,
    meta: &SnapshotMeta,
    data: &[u8],
) -> io::Result<()> {
    let mut p = lock(progress);
    if let Some((cur, _)) = &p.current
        && cur.last_log_id > meta.last_log_id
    {
        return Ok(());
    }
    if let Some(d) = dir {
        // The log is purged right after a snapshot: the snapshot must be durable first, so
        // write a fresh file, fsync it, rename it over the old one and fsync the folder. The
        // progress lock is held throughout, so two writers never share the temporary file.
        let file = SnapshotFile {
            meta: meta.clone(),
            data: data.to_vec(),
        };
        let bytes = bincode::serde::encode_to_vec(&file, bincode_cfg()).map_err(io_err)?;
        let tmp = d.join("snapshot.bin.tmp");
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, d.join("snapshot.bin"))?;
        std::fs::File::open(d)?.sync_all()?;
    }
    p.current = Some((meta.clone(), data.to_vec()));
    Ok(())
}

impl<E: Executor> RaftStateMachine<TypeConfig> for GroupStateMachine<E> {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = GroupSnapshotBuilder<E>;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let p = lock(&self.progress);
        Ok((p.last_applied, p.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some(first) = entries.try_next().await? {
            // Take every entry that is already committed, so a burst of entries (one per client
            // round) reaches the shard as one message instead of one round trip each.
            let mut ready = vec![first];
            while ready.len() < 1024 {
                match futures_util::FutureExt::now_or_never(entries.try_next()) {
                    Some(Ok(Some(e))) => ready.push(e),
                    Some(Err(e)) => return Err(e),
                    Some(Ok(None)) | None => break,
                }
            }
            let mut work = Vec::new();
            let mut done = Vec::with_capacity(ready.len());
            for (entry, responder) in ready {
                let wanted = responder.is_some();
                let normal = match entry.payload {
                    EntryPayload::Blank => false,
                    EntryPayload::Normal(proposal) => {
                        let now = {
                            let mut p = lock(&self.progress);
                            p.last_ts = p.last_ts.max(proposal.ts);
                            p.last_ts
                        };
                        self.observe(now);
                        work.push(EntryBatch {
                            group: self.group(),
                            now,
                            origin: proposal.origin,
                            cmds: proposal.cmds,
                            wanted,
                        });
                        true
                    }
                    EntryPayload::Membership(m) => {
                        lock(&self.progress).membership =
                            StoredMembership::new(Some(entry.log_id), m);
                        false
                    }
                };
                done.push((entry.log_id, responder, normal));
            }
            let mut replies = if work.is_empty() {
                Vec::new().into_iter()
            } else {
                self.exec.apply(work).await?.into_iter()
            };
            for (log_id, responder, normal) in done {
                lock(&self.progress).last_applied = Some(log_id);
                let reply = if normal {
                    Applied(replies.next().unwrap_or_else(Vec::new))
                } else {
                    Applied::default()
                };
                if let Some(r) = responder {
                    r.send(reply);
                }
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        // openraft calls this between applies, and then builds in another task while applies
        // go on: the keys must be copied out here so the snapshot matches its log id exactly.
        let (last_applied, membership, last_ts) = {
            let p = lock(&self.progress);
            (p.last_applied, p.membership.clone(), p.last_ts)
        };
        let body = self
            .exec
            .export(last_ts)
            .await
            .map(|records| SnapshotBody { last_ts, records });
        GroupSnapshotBuilder {
            progress: self.progress.clone(),
            dir: self.dir.clone(),
            meta: SnapshotMeta {
                last_log_id: last_applied,
                last_membership: membership,
            },
            body,
            _exec: std::marker::PhantomData,
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Vec<u8>,
    ) -> Result<(), io::Error> {
        let (body, _): (SnapshotBody, usize) =
            crate::cluster::decode_bounded(&snapshot).map_err(io_err)?;
        self.exec.import(body.records).await?;
        store_snapshot(&self.progress, self.dir.as_deref(), meta, &snapshot)?;
        let now = {
            let mut p = lock(&self.progress);
            p.last_applied = meta.last_log_id;
            p.membership = meta.last_membership.clone();
            p.last_ts = p.last_ts.max(body.last_ts);
            p.last_ts
        };
        self.observe(now);
        // The keys of the group expire by its time: the shard learns it as from an entry.
        self.exec
            .apply(vec![EntryBatch {
                group: self.group(),
                now,
                origin: None,
                cmds: Arc::new(Vec::new()),
                wanted: false,
            }])
            .await?;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<GroupSnapshot>, io::Error> {
        Ok(lock(&self.progress)
            .current
            .clone()
            .map(|(meta, data)| Snapshot {
                meta,
                snapshot: data,
            }))
    }
}

/// Applies a group's commands to a store owned right here; for tests and tools that run a
/// group without shard threads.
pub struct LocalExecutor {
    store: Mutex<crate::store::Store>,
}

impl Default for LocalExecutor {
    fn default() -> Self {
        LocalExecutor {
            store: Mutex::new(crate::store::Store::new(0, 0)),
        }
    }
}

impl LocalExecutor {
    fn store(&self) -> std::sync::MutexGuard<'_, crate::store::Store> {
        lock(&self.store)
    }
}

impl Executor for LocalExecutor {
    async fn apply(&self, batches: Vec<EntryBatch>) -> io::Result<Vec<Vec<Reply>>> {
        let mut st = crate::cmd::ExecStats::default();
        let mut store = self.store();
        Ok(batches
            .into_iter()
            .map(|b| {
                b.cmds
                    .iter()
                    .map(|c| crate::cmd::execute(&mut store, c, b.now, &mut st))
                    .collect()
            })
            .collect())
    }

    async fn export(&self, now: u64) -> io::Result<Vec<Record>> {
        Ok(self.store().export(now, |_| true))
    }

    async fn import(&self, records: Vec<Record>) -> io::Result<()> {
        self.store().import(&records, |_| true);
        Ok(())
    }
}
