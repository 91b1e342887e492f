//! The Raft log store against openraft's storage conformance suite, plus recovery after reopen,
//! torn and damaged log files, compaction and the in-memory mode.

use bucketd::cluster::log_store::{COMPACT_MIN_BYTES, FileLogStore};
use bucketd::cluster::state_machine::{GroupStateMachine, LocalExecutor};
use bucketd::cluster::typ::{Entry, LogId, Proposal, TypeConfig, Vote};
use bucketd::cmd::keyed::KeyCmd;
use bytes::Bytes;
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, Membership, StorageError};
use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let name = format!(
            "bucketd-raft-{tag}-{}-{nanos}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn path(&self) -> PathBuf {
        self.0.clone()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

type Sm = GroupStateMachine<LocalExecutor>;

/// Builds stores on disk (fresh directory each time) or in memory.
struct Builder {
    on_disk: bool,
}

impl StoreBuilder<TypeConfig, FileLogStore, Sm, Option<TempDir>> for Builder {
    async fn build(&self) -> Result<(Option<TempDir>, FileLogStore, Sm), StorageError<TypeConfig>> {
        let err = |e| StorageError::from_io_error(ErrorSubject::Store, ErrorVerb::Read, e);
        let dir = self.on_disk.then(|| TempDir::new("suite"));
        let path = dir.as_ref().map(TempDir::path);
        let store = FileLogStore::open(path.clone(), true).map_err(err)?;
        let sm = GroupStateMachine::open(Arc::new(LocalExecutor::default()), path).map_err(err)?;
        Ok((dir, store, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_on_disk() {
    Suite::test_all(Builder { on_disk: true }).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_in_memory() {
    Suite::test_all(Builder { on_disk: false }).await.unwrap();
}

fn log_id(term: u64, index: u64) -> LogId {
    openraft::testing::log_id::<TypeConfig>(term, 1, index)
}

fn blank(term: u64, index: u64) -> Entry {
    Entry::new_blank(log_id(term, index))
}

/// A normal entry whose payload is about `size` bytes.
fn normal(term: u64, index: u64, size: usize) -> Entry {
    let key = Bytes::from(vec![b'k'; size]);
    Entry::new_normal(
        log_id(term, index),
        Proposal {
            ts: index * 1000,
            origin: None,
            cmds: vec![KeyCmd::IncrBy {
                key,
                delta: index as i64,
            }],
        },
    )
}

fn membership(term: u64, index: u64, voters: &[u64]) -> Entry {
    let set: BTreeSet<u64> = voters.iter().copied().collect();
    Entry::new_membership(
        log_id(term, index),
        Membership::new_with_defaults(vec![set], []),
    )
}

/// Appends and waits until the store reports the entries flushed.
async fn append(store: &mut FileLogStore, entries: Vec<Entry>) {
    let (tx, rx) = TypeConfig::oneshot();
    store.append(entries, IOFlushed::signal(tx)).await.unwrap();
    rx.await.unwrap().unwrap();
}

async fn all_entries(store: &mut FileLogStore) -> Vec<Entry> {
    store
        .get_log_reader()
        .await
        .try_get_log_entries(..)
        .await
        .unwrap()
}

fn ids(entries: &[Entry]) -> Vec<LogId> {
    entries.iter().map(|e| e.log_id).collect()
}

fn log_file(dir: &Path) -> PathBuf {
    dir.join("log.bin")
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// Writes a log with every kind of change: appends of each payload kind, a purge, a
/// truncation followed by a conflicting append, a vote and a committed log id.
async fn write_history(store: &mut FileLogStore) {
    append(store, vec![membership(1, 1, &[1, 2, 3]), blank(1, 2)]).await;
    for i in 3..=20 {
        append(store, vec![normal(1, i, 16)]).await;
    }
    store.save_vote(&Vote::new(2, 1)).await.unwrap();
    store.save_committed(Some(log_id(1, 15))).await.unwrap();
    store.purge(log_id(1, 5)).await.unwrap();
    store.truncate_after(Some(log_id(1, 18))).await.unwrap();
    append(store, vec![blank(2, 19), normal(2, 20, 8)]).await;
    store.save_vote(&Vote::new_committed(2, 1)).await.unwrap();
}

async fn check_history(store: &mut FileLogStore) {
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 5)));
    assert_eq!(state.last_log_id, Some(log_id(2, 20)));

    let entries = all_entries(store).await;
    let mut want: Vec<LogId> = (6..=18).map(|i| log_id(1, i)).collect();
    want.extend([log_id(2, 19), log_id(2, 20)]);
    assert_eq!(ids(&entries), want);
    match &entries[0].payload {
        EntryPayload::Normal(p) => {
            assert_eq!(p.ts, 6000);
            assert!(matches!(&p.cmds[..], [KeyCmd::IncrBy { key, delta: 6 }] if key.len() == 16));
        }
        other => panic!("entry 6 should be normal, got {other:?}"),
    }
    assert!(matches!(entries[13].payload, EntryPayload::Blank));

    assert_eq!(
        store.get_log_reader().await.read_vote().await.unwrap(),
        Some(Vote::new_committed(2, 1))
    );
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 15)));
}

#[tokio::test]
async fn reopen_recovers_everything() {
    for fsync in [true, false] {
        let dir = TempDir::new("reopen");
        {
            let mut store = FileLogStore::open(Some(dir.path()), fsync).unwrap();
            write_history(&mut store).await;
            check_history(&mut store).await;
        }
        let mut store = FileLogStore::open(Some(dir.path()), fsync).unwrap();
        check_history(&mut store).await;

        // The reopened log takes further changes and keeps them across another reopen.
        append(&mut store, vec![blank(2, 21)]).await;
        store.purge(log_id(1, 10)).await.unwrap();
        drop(store);
        let mut store = FileLogStore::open(Some(dir.path()), fsync).unwrap();
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 10)));
        assert_eq!(state.last_log_id, Some(log_id(2, 21)));
        assert_eq!(all_entries(&mut store).await.len(), 11);
    }
}

#[tokio::test]
async fn purge_past_the_last_entry_survives_reopen() {
    let dir = TempDir::new("purge-all");
    {
        let mut store = FileLogStore::open(Some(dir.path()), true).unwrap();
        append(&mut store, (1..=5).map(|i| blank(1, i)).collect()).await;
        store.purge(log_id(2, 9)).await.unwrap();
    }
    let mut store = FileLogStore::open(Some(dir.path()), true).unwrap();
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(2, 9)));
    assert_eq!(state.last_log_id, Some(log_id(2, 9)));
    assert!(all_entries(&mut store).await.is_empty());

    append(&mut store, vec![blank(2, 10)]).await;
    drop(store);
    let mut store = FileLogStore::open(Some(dir.path()), true).unwrap();
    assert_eq!(ids(&all_entries(&mut store).await), vec![log_id(2, 10)]);
}

#[tokio::test]
async fn truncate_everything_survives_reopen() {
    let dir = TempDir::new("truncate-all");
    {
        let mut store = FileLogStore::open(Some(dir.path()), false).unwrap();
        append(&mut store, (0..=5).map(|i| blank(1, i)).collect()).await;
        store.truncate_after(None).await.unwrap();
    }
    let mut store = FileLogStore::open(Some(dir.path()), false).unwrap();
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, None);
    assert_eq!(state.last_log_id, None);
}

#[tokio::test]
async fn torn_tail_is_dropped() {
    let dir = TempDir::new("torn");
    {
        let mut store = FileLogStore::open(Some(dir.path()), true).unwrap();
        for i in 1..=10 {
            append(&mut store, vec![normal(1, i, 32)]).await;
        }
    }
    // A process killed in the middle of writing the last record.
    let path = log_file(&dir.0);
    let len = file_len(&path);
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 5)
        .unwrap();

    {
        let mut store = FileLogStore::open(Some(dir.path()), true).unwrap();
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(1, 9)));
        // The torn bytes are cut off, so new records do not land behind them.
        append(&mut store, vec![normal(2, 10, 32)]).await;
    }
    let mut store = FileLogStore::open(Some(dir.path()), true).unwrap();
    let entries = all_entries(&mut store).await;
    assert_eq!(entries.len(), 10);
    assert_eq!(entries[9].log_id, log_id(2, 10));
}

#[tokio::test]
async fn zero_filled_tail_is_dropped() {
    let dir = TempDir::new("zeros");
    {
        let mut store = FileLogStore::open(Some(dir.path()), true).unwrap();
        append(&mut store, (1..=3).map(|i| blank(1, i)).collect()).await;
    }
    // A power loss can leave the file longer than the data that reached the disk.
    let path = log_file(&dir.0);
    let len = file_len(&path);
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len + 100)
        .unwrap();

    let mut store = FileLogStore::open(Some(dir.path()), true).unwrap();
    assert_eq!(
        store.get_log_state().await.unwrap().last_log_id,
        Some(log_id(1, 3))
    );
    assert_eq!(file_len(&path), len);
}

#[tokio::test]
async fn damaged_record_before_the_end_fails_to_open() {
    let dir = TempDir::new("damaged");
    {
        let mut store = FileLogStore::open(Some(dir.path()), false).unwrap();
        for i in 1..=3 {
            append(&mut store, vec![normal(1, i, 32)]).await;
        }
    }
    let path = log_file(&dir.0);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[20] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();

    let err = FileLogStore::open(Some(dir.path()), false).err().unwrap();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
}

#[tokio::test]
async fn damaged_vote_fails_to_open() {
    let dir = TempDir::new("bad-vote");
    {
        let mut store = FileLogStore::open(Some(dir.path()), false).unwrap();
        store.save_vote(&Vote::new(3, 1)).await.unwrap();
    }
    let path = dir.0.join("vote.bin");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    assert!(FileLogStore::open(Some(dir.path()), false).is_err());
}

#[tokio::test]
async fn purged_garbage_is_compacted() {
    let dir = TempDir::new("compact");
    let entry_size = 1000;
    let count = 3 * COMPACT_MIN_BYTES / entry_size as u64;
    let keep_from = count - 50;
    {
        let mut store = FileLogStore::open(Some(dir.path()), false).unwrap();
        for chunk in (1..=count).collect::<Vec<_>>().chunks(100) {
            append(
                &mut store,
                chunk.iter().map(|&i| normal(1, i, entry_size)).collect(),
            )
            .await;
        }
        let full = file_len(&log_file(&dir.0));
        assert!(full > 2 * COMPACT_MIN_BYTES);

        store.purge(log_id(1, keep_from - 1)).await.unwrap();
        let compacted = file_len(&log_file(&dir.0));
        assert!(
            compacted < 60 * (entry_size as u64 + 100),
            "log not compacted: {compacted} bytes"
        );

        // The compacted file is appended to like any other.
        append(&mut store, vec![normal(2, count + 1, entry_size)]).await;
        store.truncate_after(Some(log_id(1, count))).await.unwrap();
        append(&mut store, vec![blank(3, count + 1)]).await;
    }
    let mut store = FileLogStore::open(Some(dir.path()), false).unwrap();
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, keep_from - 1)));
    assert_eq!(state.last_log_id, Some(log_id(3, count + 1)));
    let entries = all_entries(&mut store).await;
    assert_eq!(entries.len(), 52);
    assert_eq!(entries[0].log_id, log_id(1, keep_from));
    assert!(matches!(&entries[0].payload, EntryPayload::Normal(p) if p.ts == keep_from * 1000));
}

#[tokio::test]
async fn truncated_garbage_is_compacted() {
    let dir = TempDir::new("compact-truncate");
    let entry_size = 1000;
    let count = 3 * COMPACT_MIN_BYTES / entry_size as u64;
    {
        let mut store = FileLogStore::open(Some(dir.path()), true).unwrap();
        for chunk in (1..=count).collect::<Vec<_>>().chunks(200) {
            append(
                &mut store,
                chunk.iter().map(|&i| normal(1, i, entry_size)).collect(),
            )
            .await;
        }
        store.truncate_after(Some(log_id(1, 10))).await.unwrap();
        assert!(file_len(&log_file(&dir.0)) < 20 * (entry_size as u64 + 100));
    }
    let mut store = FileLogStore::open(Some(dir.path()), true).unwrap();
    assert_eq!(
        ids(&all_entries(&mut store).await),
        (1..=10).map(|i| log_id(1, i)).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn in_memory_mode() {
    let mut store = FileLogStore::open(None, false).unwrap();
    let mut reader = store.get_log_reader().await;
    write_history(&mut store).await;
    check_history(&mut store).await;
    // A reader taken before the writes sees them.
    assert_eq!(reader.try_get_log_entries(19..=20).await.unwrap().len(), 2);
    assert_eq!(
        reader.read_vote().await.unwrap(),
        Some(Vote::new_committed(2, 1))
    );
}

#[tokio::test]
async fn flushed_callback_fires_once_data_is_written() {
    let dir = TempDir::new("callback");
    let mut store = FileLogStore::open(Some(dir.path()), true).unwrap();
    let (tx, rx) = TypeConfig::oneshot();
    store
        .append(vec![blank(1, 1), blank(1, 2)], IOFlushed::signal(tx))
        .await
        .unwrap();
    // Readable as soon as append returns, whether or not the flush is done.
    assert_eq!(all_entries(&mut store).await.len(), 2);
    rx.await.unwrap().unwrap();
    assert!(file_len(&log_file(&dir.0)) > 0);
}
