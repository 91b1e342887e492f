//! The node's Raft log against openraft's storage conformance suite, run for several groups of
//! one shared log at once, plus recovery of interleaved groups after reopen, torn and damaged
//! log files, compaction, batching of concurrent groups' writes and the in-memory mode.

#![cfg(feature = "server")]

use bucketd::testing::{
    COMPACT_MIN_BYTES, COMPACT_RATIO, GroupId, GroupLog, GroupStateMachine, KeyCmd, LocalExecutor,
    LogEntry, LogId, NodeLog, Proposal, TypeConfig, Vote,
};

use bytes::Bytes;
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, Membership, StorageError};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

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

/// Hands every test of the suite a group of its own, all on one shared log: group ids `next`,
/// `next + step`, ... Each group starts empty, and the suite's writes to different groups land
/// in the same file and the same batches.
struct Builder {
    log: NodeLog,
    next: AtomicU32,
    step: u32,
    on_disk: bool,
}

impl Builder {
    fn new(log: &NodeLog, first: GroupId, step: u32, on_disk: bool) -> Builder {
        Builder {
            log: log.clone(),
            next: AtomicU32::new(first),
            step,
            on_disk,
        }
    }
}

impl StoreBuilder<TypeConfig, GroupLog, Sm, Option<TempDir>> for Builder {
    async fn build(&self) -> Result<(Option<TempDir>, GroupLog, Sm), StorageError<TypeConfig>> {
        let err = |e| StorageError::from_io_error(ErrorSubject::Store, ErrorVerb::Read, e);
        let g = self.next.fetch_add(self.step, Ordering::Relaxed);
        // The state machine keeps its snapshots per group, in a directory of its own.
        let dir = self.on_disk.then(|| TempDir::new("suite-sm"));
        let path = dir.as_ref().map(TempDir::path);
        let sm = GroupStateMachine::open(Arc::new(LocalExecutor::default()), path).map_err(err)?;
        Ok((dir, self.log.group(g), sm))
    }
}

/// What a group's log holds, in a comparable form.
#[derive(Debug, PartialEq)]
struct Seen {
    purged: Option<LogId>,
    last: Option<LogId>,
    entries: Vec<String>,
    vote: Option<Vote>,
    committed: Option<LogId>,
}

async fn seen(store: &mut GroupLog) -> Seen {
    let state = store.get_log_state().await.unwrap();
    let mut reader = store.get_log_reader().await;
    Seen {
        purged: state.last_purged_log_id,
        last: state.last_log_id,
        entries: all_entries(store)
            .await
            .iter()
            .map(|e| format!("{e:?}"))
            .collect(),
        vote: reader.read_vote().await.unwrap(),
        committed: store.read_committed().await.unwrap(),
    }
}

/// Runs the suite for two interleaved sequences of groups of one log at once (even groups from
/// 0, odd ones from 7); on disk, then reopens the log and checks every group came back as the
/// suite left it.
async fn suite_on_shared_log(dir: Option<&TempDir>) {
    let log = NodeLog::open(dir.map(TempDir::path), true).unwrap();
    let on_disk = dir.is_some();
    let (a, b) = tokio::join!(
        Suite::test_all(Builder::new(&log, 0, 2, on_disk)),
        Suite::test_all(Builder::new(&log, 7, 2, on_disk)),
    );
    a.unwrap();
    b.unwrap();
    assert!(log.writes() > 0 || !on_disk);
    let Some(dir) = dir else { return };

    let used: Vec<GroupId> = (0..400).step_by(2).chain((7..400).step_by(2)).collect();
    let mut before = Vec::new();
    for &g in &used {
        before.push(seen(&mut log.group(g)).await);
    }
    assert!(before.iter().any(|s| !s.entries.is_empty()));
    drop(log);
    let log = NodeLog::open(Some(dir.path()), true).unwrap();
    for (&g, want) in used.iter().zip(&before) {
        assert_eq!(&seen(&mut log.group(g)).await, want, "group {g}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_on_disk() {
    let dir = TempDir::new("suite");
    suite_on_shared_log(Some(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_in_memory() {
    suite_on_shared_log(None).await;
}

fn log_id(term: u64, index: u64) -> LogId {
    openraft::testing::log_id::<TypeConfig>(term, 1, index)
}

fn blank(term: u64, index: u64) -> LogEntry {
    LogEntry::new_blank(log_id(term, index))
}

/// A normal entry whose payload is about `size` bytes.
fn normal(term: u64, index: u64, size: usize) -> LogEntry {
    let key = Bytes::from(vec![b'k'; size]);
    LogEntry::new_normal(
        log_id(term, index),
        Proposal::new(
            index * 1000,
            None,
            vec![KeyCmd::IncrBy {
                key,
                delta: index as i64,
            }],
        ),
    )
}

fn membership(term: u64, index: u64, voters: &[u64]) -> LogEntry {
    let set: BTreeSet<u64> = voters.iter().copied().collect();
    LogEntry::new_membership(
        log_id(term, index),
        Membership::new_with_defaults(vec![set], []),
    )
}

/// Appends and waits until the store reports the entries flushed.
async fn append(store: &mut GroupLog, entries: Vec<LogEntry>) {
    let (tx, rx) = TypeConfig::oneshot();
    store.append(entries, IOFlushed::signal(tx)).await.unwrap();
    rx.await.unwrap().unwrap();
}

async fn all_entries(store: &mut GroupLog) -> Vec<LogEntry> {
    store
        .get_log_reader()
        .await
        .try_get_log_entries(..)
        .await
        .unwrap()
}

fn ids(entries: &[LogEntry]) -> Vec<LogId> {
    entries.iter().map(|e| e.log_id).collect()
}

fn log_dir(dir: &Path) -> PathBuf {
    dir.join("raft-log")
}

fn log_file(dir: &Path) -> PathBuf {
    log_dir(dir).join("log.bin")
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

fn open(dir: &TempDir, fsync: bool) -> NodeLog {
    NodeLog::open(Some(log_dir(&dir.0)), fsync).unwrap()
}

/// The groups of the recovery tests, each with its own variant `p` of the history, so a record
/// replayed into the wrong group shows.
const GROUPS: [(GroupId, u64); 3] = [(0, 0), (3, 1), (42, 2)];

/// Step `step` of group variant `p`'s history: appends of each payload kind, a vote, a
/// committed log id, a purge, a truncation followed by a conflicting append, and a new vote.
async fn history_step(store: &mut GroupLog, p: u64, step: usize) {
    match step {
        0 => append(store, vec![membership(1, 1, &[1, 2, 3]), blank(1, 2)]).await,
        1..=18 => append(store, vec![normal(1, step as u64 + 2, 16 + p as usize)]).await,
        19 => store.save_vote(&Vote::new(2 + p, 1)).await.unwrap(),
        20 => store.save_committed(Some(log_id(1, 10 + p))).await.unwrap(),
        21 => store.purge(log_id(1, 3 + p)).await.unwrap(),
        22 => store.truncate_after(Some(log_id(1, 18 - p))).await.unwrap(),
        23 => append(store, vec![blank(2, 19 - p), normal(2, 20 - p, 8)]).await,
        24 => store
            .save_vote(&Vote::new_committed(2 + p, 1))
            .await
            .unwrap(),
        _ => {}
    }
}

const HISTORY_STEPS: usize = 25;

/// Writes every group's history, one step of each group in turn.
async fn write_interleaved(log: &NodeLog) {
    for step in 0..HISTORY_STEPS {
        for (g, p) in GROUPS {
            history_step(&mut log.group(g), p, step).await;
        }
    }
}

/// Writes every group's history from a task of its own, all at once.
async fn write_concurrently(log: &NodeLog) {
    let tasks: Vec<_> = GROUPS
        .iter()
        .map(|&(g, p)| {
            let mut store = log.group(g);
            tokio::spawn(async move {
                for step in 0..HISTORY_STEPS {
                    history_step(&mut store, p, step).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

async fn check_history(store: &mut GroupLog, p: u64) {
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 3 + p)));
    assert_eq!(state.last_log_id, Some(log_id(2, 20 - p)));

    let entries = all_entries(store).await;
    let mut want: Vec<LogId> = (4 + p..=18 - p).map(|i| log_id(1, i)).collect();
    want.extend([log_id(2, 19 - p), log_id(2, 20 - p)]);
    assert_eq!(ids(&entries), want, "variant {p}");
    match &entries[0].payload {
        EntryPayload::Normal(e) => {
            assert_eq!(e.ts, (4 + p) * 1000);
            assert!(matches!(
                &e.cmds[..],
                [KeyCmd::IncrBy { key, delta }] if key.len() == 16 + p as usize && *delta == 4 + p as i64
            ));
        }
        other => panic!("first entry should be normal, got {other:?}"),
    }
    assert!(matches!(
        entries[entries.len() - 2].payload,
        EntryPayload::Blank
    ));

    assert_eq!(
        store.get_log_reader().await.read_vote().await.unwrap(),
        Some(Vote::new_committed(2 + p, 1))
    );
    assert_eq!(
        store.read_committed().await.unwrap(),
        Some(log_id(1, 10 + p))
    );
}

async fn check_all(log: &NodeLog) {
    for (g, p) in GROUPS {
        check_history(&mut log.group(g), p).await;
    }
    // A group that never wrote anything is empty.
    let mut untouched = log.group(5);
    assert_eq!(seen(&mut untouched).await.last, None);
    assert_eq!(untouched.read_committed().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_recovers_every_group() {
    for fsync in [true, false] {
        for concurrent in [false, true] {
            let dir = TempDir::new("reopen");
            {
                let log = open(&dir, fsync);
                if concurrent {
                    write_concurrently(&log).await;
                } else {
                    write_interleaved(&log).await;
                }
                check_all(&log).await;
            }
            let log = open(&dir, fsync);
            check_all(&log).await;

            // The reopened log takes further changes and keeps them across another reopen.
            for (g, p) in GROUPS {
                let mut store = log.group(g);
                append(&mut store, vec![blank(2, 21 - p)]).await;
                store.purge(log_id(1, 10)).await.unwrap();
            }
            drop(log);
            let log = open(&dir, fsync);
            for (g, p) in GROUPS {
                let mut store = log.group(g);
                let state = store.get_log_state().await.unwrap();
                assert_eq!(state.last_purged_log_id, Some(log_id(1, 10)));
                assert_eq!(state.last_log_id, Some(log_id(2, 21 - p)));
                assert_eq!(all_entries(&mut store).await.len() as u64, 11 - p);
            }
        }
    }
}

#[tokio::test]
async fn changes_are_on_disk_when_reported_done() {
    // A copy of the file taken right after a call returns holds the change: nothing waits for
    // a later write or for the log to close.
    let dir = TempDir::new("durable");
    let log = open(&dir, true);
    let mut a = log.group(1);
    let mut b = log.group(2);
    let copy = |tag: &str| {
        let to = TempDir::new(tag);
        std::fs::create_dir_all(log_dir(&to.0)).unwrap();
        std::fs::copy(log_file(&dir.0), log_file(&to.0)).unwrap();
        to
    };

    append(&mut a, vec![blank(1, 1), blank(1, 2)]).await;
    let snap = copy("durable-append");
    assert_eq!(
        open(&snap, true)
            .group(1)
            .get_log_state()
            .await
            .unwrap()
            .last_log_id,
        Some(log_id(1, 2))
    );

    b.save_vote(&Vote::new(4, 2)).await.unwrap();
    let snap = copy("durable-vote");
    assert_eq!(
        open(&snap, true).group(2).read_vote().await.unwrap(),
        Some(Vote::new(4, 2))
    );

    a.truncate_after(Some(log_id(1, 1))).await.unwrap();
    let snap = copy("durable-truncate");
    assert_eq!(
        ids(&all_entries(&mut open(&snap, true).group(1)).await),
        vec![log_id(1, 1)]
    );

    a.purge(log_id(1, 1)).await.unwrap();
    let snap = copy("durable-purge");
    let state = open(&snap, true).group(1).get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1)));
}

#[tokio::test]
async fn committed_alone_is_kept() {
    // A committed log id is not waited for; it still reaches the file when nothing else follows,
    // within a bounded delay while open and at once when the log closes.
    let dir = TempDir::new("committed");
    {
        let log = open(&dir, false);
        let mut store = log.group(9);
        append(&mut store, (1..=3).map(|i| blank(1, i)).collect()).await;
        let writes = log.writes();
        store.save_committed(Some(log_id(1, 2))).await.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while log.writes() == writes {
            assert!(
                std::time::Instant::now() < deadline,
                "committed never written"
            );
            tokio::task::yield_now().await;
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        store.save_committed(Some(log_id(1, 3))).await.unwrap();
    }
    let log = open(&dir, false);
    assert_eq!(
        log.group(9).read_committed().await.unwrap(),
        Some(log_id(1, 3))
    );
}

#[tokio::test]
async fn purge_past_the_last_entry_survives_reopen() {
    let dir = TempDir::new("purge-all");
    {
        let log = open(&dir, true);
        let mut store = log.group(1);
        append(&mut store, (1..=5).map(|i| blank(1, i)).collect()).await;
        append(&mut log.group(2), (1..=5).map(|i| blank(1, i)).collect()).await;
        store.purge(log_id(2, 9)).await.unwrap();
    }
    let log = open(&dir, true);
    let mut store = log.group(1);
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(2, 9)));
    assert_eq!(state.last_log_id, Some(log_id(2, 9)));
    assert!(all_entries(&mut store).await.is_empty());
    // The other group keeps its entries.
    assert_eq!(all_entries(&mut log.group(2)).await.len(), 5);

    append(&mut store, vec![blank(2, 10)]).await;
    drop((store, log));
    let log = open(&dir, true);
    assert_eq!(
        ids(&all_entries(&mut log.group(1)).await),
        vec![log_id(2, 10)]
    );
}

#[tokio::test]
async fn truncate_everything_survives_reopen() {
    let dir = TempDir::new("truncate-all");
    {
        let log = open(&dir, false);
        append(&mut log.group(1), (0..=5).map(|i| blank(1, i)).collect()).await;
        append(&mut log.group(2), (0..=5).map(|i| blank(1, i)).collect()).await;
        log.group(1).truncate_after(None).await.unwrap();
    }
    let log = open(&dir, false);
    let state = log.group(1).get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, None);
    assert_eq!(state.last_log_id, None);
    assert_eq!(
        log.group(2).get_log_state().await.unwrap().last_log_id,
        Some(log_id(1, 5))
    );
}

/// A log with every group's history, then one more entry of group 3, whose record is the last
/// in the file: returns the file's bytes and where that record starts.
async fn history_then_last_record() -> (Vec<u8>, usize) {
    let dir = TempDir::new("torn-src");
    let log = open(&dir, false);
    write_interleaved(&log).await;
    let before = file_len(&log_file(&dir.0));
    append(&mut log.group(3), vec![normal(2, 20, 64)]).await;
    drop(log);
    (std::fs::read(log_file(&dir.0)).unwrap(), before as usize)
}

/// Opens a log made of `bytes` and checks what it recovered: every group's history, and the
/// last entry of group 3 only when `last_kept`. Then appends and reopens, to show new records
/// do not land behind a torn one.
async fn recover_from(bytes: &[u8], last_kept: bool) {
    let last_index = if last_kept { 20 } else { 19 };
    let dir = TempDir::new("torn");
    std::fs::create_dir_all(log_dir(&dir.0)).unwrap();
    std::fs::write(log_file(&dir.0), bytes).unwrap();
    {
        let log = open(&dir, true);
        check_recovered(&log, last_index).await;
        append(&mut log.group(3), vec![blank(3, last_index + 1)]).await;
    }
    let log = open(&dir, true);
    check_recovered(&log, last_index + 1).await;
}

/// Every group's history, except that group 3 (variant 1, whose history ends at index 19)
/// ends at `last_index`.
async fn check_recovered(log: &NodeLog, last_index: u64) {
    for (g, p) in GROUPS {
        let mut store = log.group(g);
        if g != 3 {
            check_history(&mut store, p).await;
            continue;
        }
        let entries = ids(&all_entries(&mut store).await);
        assert_eq!(entries.first(), Some(&log_id(1, 5)));
        assert_eq!(entries.last().map(|l| l.index), Some(last_index));
        assert_eq!(entries.len() as u64, last_index - 4);
        assert_eq!(
            store.read_vote().await.unwrap(),
            Some(Vote::new_committed(3, 1))
        );
        assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 11)));
    }
}

#[tokio::test]
async fn torn_tail_is_dropped() {
    let (bytes, last) = history_then_last_record().await;
    let end = bytes.len();
    assert!(end - last > 64, "the last record holds the entry");
    // A process killed at any point while writing the last record: inside its header, right
    // after it, inside its payload, one byte short.
    for cut in [
        last + 1,
        last + 4,
        last + 7,
        last + 8,
        last + 9,
        last + 40,
        end - 1,
    ] {
        recover_from(&bytes[..cut], false).await;
    }
    recover_from(&bytes, true).await;
}

#[tokio::test]
async fn zero_filled_tail_is_dropped() {
    let (bytes, last) = history_then_last_record().await;
    // A power loss can leave the file longer than the data that reached the disk: after whole
    // records, and after a record whose length reached the disk but whose data did not.
    let mut padded = bytes.clone();
    padded.extend_from_slice(&[0; 100]);
    recover_from(&padded, true).await;

    let mut torn = bytes[..last + 12].to_vec();
    torn.resize(bytes.len() + 50, 0);
    recover_from(&torn, false).await;

    // The file is cut back to the whole records.
    let dir = TempDir::new("zeros");
    std::fs::create_dir_all(log_dir(&dir.0)).unwrap();
    std::fs::write(log_file(&dir.0), &padded).unwrap();
    drop(open(&dir, true));
    assert_eq!(file_len(&log_file(&dir.0)), bytes.len() as u64);
}

#[tokio::test]
async fn damaged_record_before_the_end_fails_to_open() {
    let (bytes, last) = history_then_last_record().await;
    for at in [20, bytes.len() / 2, last - 3] {
        let dir = TempDir::new("damaged");
        std::fs::create_dir_all(log_dir(&dir.0)).unwrap();
        let mut damaged = bytes.clone();
        damaged[at] ^= 0xff;
        std::fs::write(log_file(&dir.0), damaged).unwrap();
        let err = NodeLog::open(Some(log_dir(&dir.0)), false).err().unwrap();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("log.bin"), "{err}");
        // Nothing was cut off the damaged file.
        assert_eq!(file_len(&log_file(&dir.0)), bytes.len() as u64);
    }
}

#[tokio::test]
async fn damaged_vote_fails_to_open() {
    let dir = TempDir::new("bad-vote");
    let (from, to) = {
        let log = open(&dir, false);
        append(&mut log.group(1), vec![blank(1, 1)]).await;
        let from = file_len(&log_file(&dir.0));
        log.group(2).save_vote(&Vote::new(3, 1)).await.unwrap();
        let to = file_len(&log_file(&dir.0));
        append(&mut log.group(1), vec![blank(1, 2)]).await;
        (from as usize, to as usize)
    };
    let path = log_file(&dir.0);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(from + to) / 2] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    assert!(NodeLog::open(Some(log_dir(&dir.0)), false).is_err());
}

/// Returns once the writer finished everything it started before this call, compaction
/// included: the writer does one thing at a time, and compacts right after the write that made
/// it due, before it takes the next changes. Saves the group's vote again, which changes nothing.
async fn writer_caught_up(store: &mut GroupLog) {
    let vote = store.read_vote().await.unwrap().unwrap_or(Vote::new(1, 1));
    store.save_vote(&vote).await.unwrap();
}

/// Appends `count` entries of about `size` bytes to each group, interleaved in chunks.
async fn fill(log: &NodeLog, groups: &[GroupId], count: u64, size: usize) {
    for chunk in (1..=count).collect::<Vec<_>>().chunks(100) {
        for &g in groups {
            append(
                &mut log.group(g),
                chunk.iter().map(|&i| normal(1, i, size)).collect(),
            )
            .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purged_garbage_is_compacted() {
    let dir = TempDir::new("compact");
    let entry_size = 1000;
    let count = COMPACT_MIN_BYTES / entry_size as u64;
    let kept = 20;
    let keep_from = count - kept;
    // One group more than the ratio: once all but one are purged, what stays is less than
    // 1 / COMPACT_RATIO of the file.
    let groups: Vec<GroupId> = (1..=COMPACT_RATIO as GroupId + 1).collect();
    let (a, c) = (groups[0], groups[groups.len() - 1]);
    let n = groups.len();
    let full;
    {
        let log = open(&dir, false);
        fill(&log, &groups, count, entry_size).await;
        for &g in &groups {
            let mut store = log.group(g);
            store
                .save_vote(&Vote::new_committed(g as u64, 1))
                .await
                .unwrap();
            store
                .save_committed(Some(log_id(1, count - 10)))
                .await
                .unwrap();
        }
        full = file_len(&log_file(&dir.0));
        assert!(full > n as u64 * COMPACT_MIN_BYTES);

        // All groups but two purged: two of them still live is more than 1 / COMPACT_RATIO of
        // the file, not yet worth a rewrite.
        for &g in &groups[..n - 2] {
            log.group(g).purge(log_id(1, keep_from - 1)).await.unwrap();
        }
        writer_caught_up(&mut log.group(c)).await;
        assert!(file_len(&log_file(&dir.0)) >= full);
        // One more purge leaves one group's entries: less than 1 / COMPACT_RATIO is live.
        log.group(groups[n - 2])
            .purge(log_id(1, keep_from - 1))
            .await
            .unwrap();
        // Without fsync the rewrite runs in the background while appends go on: wait for it.
        let c_bytes = count * entry_size as u64;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            writer_caught_up(&mut log.group(c)).await;
            if file_len(&log_file(&dir.0)) < full / 2 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "log never compacted");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let compacted = file_len(&log_file(&dir.0));
        // The purged groups' kept entries, and room for every group's vote, committed id and
        // purge marker.
        let slack = (n as u64 - 1) * (kept + 1) + 50;
        assert!(
            compacted > c_bytes && compacted < c_bytes + slack * (entry_size as u64 + 100),
            "log not compacted: {compacted} bytes of {full}"
        );

        // The compacted file is appended to like any other.
        let mut store = log.group(a);
        append(&mut store, vec![normal(2, count + 1, entry_size)]).await;
        store.truncate_after(Some(log_id(1, count))).await.unwrap();
        append(&mut store, vec![blank(3, count + 1)]).await;
    }
    let log = open(&dir, false);
    for &g in &groups {
        let mut store = log.group(g);
        let state = store.get_log_state().await.unwrap();
        let entries = all_entries(&mut store).await;
        if g == c {
            assert_eq!(state.last_purged_log_id, None);
            assert_eq!(entries.len() as u64, count);
        } else {
            assert_eq!(state.last_purged_log_id, Some(log_id(1, keep_from - 1)));
            assert_eq!(entries[0].log_id, log_id(1, keep_from));
            assert!(
                matches!(&entries[0].payload, EntryPayload::Normal(p) if p.ts == keep_from * 1000)
            );
        }
        if g == a {
            assert_eq!(state.last_log_id, Some(log_id(3, count + 1)));
            assert_eq!(entries.len() as u64, kept + 2);
        } else {
            assert_eq!(state.last_log_id, Some(log_id(1, count)));
        }
        assert_eq!(
            store.read_vote().await.unwrap(),
            Some(Vote::new_committed(g as u64, 1))
        );
        assert_eq!(
            store.read_committed().await.unwrap(),
            Some(log_id(1, count - 10))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_garbage_is_compacted() {
    let dir = TempDir::new("compact-truncate");
    let entry_size = 1000;
    let count = 2 * COMPACT_MIN_BYTES / entry_size as u64;
    {
        let log = open(&dir, true);
        fill(&log, &[4, 8], count, entry_size).await;
        log.group(4)
            .truncate_after(Some(log_id(1, 10)))
            .await
            .unwrap();
        log.group(8)
            .truncate_after(Some(log_id(1, 20)))
            .await
            .unwrap();
        writer_caught_up(&mut log.group(8)).await;
        assert!(file_len(&log_file(&dir.0)) < 40 * (entry_size as u64 + 100));
    }
    let log = open(&dir, true);
    for (g, last) in [(4, 10), (8, 20)] {
        assert_eq!(
            ids(&all_entries(&mut log.group(g)).await),
            (1..=last).map(|i| log_id(1, i)).collect::<Vec<_>>()
        );
    }
}

#[tokio::test]
async fn in_memory_mode() {
    let log = NodeLog::open(None, false).unwrap();
    let mut reader = log.group(42).get_log_reader().await;
    write_interleaved(&log).await;
    check_all(&log).await;
    // A reader taken before the writes sees them.
    assert_eq!(reader.try_get_log_entries(17..=18).await.unwrap().len(), 2);
    assert_eq!(
        reader.read_vote().await.unwrap(),
        Some(Vote::new_committed(4, 1))
    );
    assert_eq!(log.writes(), 0);
}

#[tokio::test]
async fn flushed_callback_fires_once_data_is_written() {
    let dir = TempDir::new("callback");
    let log = open(&dir, true);
    let mut store = log.group(0);
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

#[tokio::test]
async fn fsync_mode_syncs_and_the_other_does_not() {
    for fsync in [true, false] {
        let dir = TempDir::new("fsync");
        {
            let log = open(&dir, fsync);
            write_interleaved(&log).await;
            assert!(log.writes() > 0);
            if fsync {
                // Every write someone waits for is fsynced; a committed log id alone is not.
                assert!(log.syncs() > 0 && log.syncs() <= log.writes());
            } else {
                assert_eq!(log.syncs(), 0);
            }
        }
        check_all(&open(&dir, fsync)).await;
    }
}

/// `groups` tasks each issue `per_group` appends of one entry to their own group of one log, all
/// at once, and wait for every flush; returns the writes the log made.
async fn concurrent_appends(dir: &TempDir, fsync: bool, groups: u32, per_group: u64) -> u64 {
    let log = open(dir, fsync);
    let writes_before = log.writes();
    let start = Arc::new(tokio::sync::Barrier::new(groups as usize));
    let tasks: Vec<_> = (0..groups)
        .map(|g| {
            let mut store = log.group(g);
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                let mut flushed = Vec::new();
                for i in 1..=per_group {
                    let (tx, rx) = TypeConfig::oneshot();
                    store
                        .append(vec![normal(1, i, 32)], IOFlushed::signal(tx))
                        .await
                        .unwrap();
                    flushed.push(rx);
                }
                for rx in flushed {
                    rx.await.unwrap().unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let writes = log.writes() - writes_before;
    for g in 0..groups {
        assert_eq!(all_entries(&mut log.group(g)).await.len() as u64, per_group);
    }
    drop(log);
    let log = open(dir, fsync);
    for g in 0..groups {
        assert_eq!(
            all_entries(&mut log.group(g)).await.last().unwrap().log_id,
            log_id(1, per_group)
        );
    }
    writes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_groups_share_writes() {
    let (groups, per_group) = (8, 200);
    let appends = u64::from(groups) * per_group;
    for fsync in [true, false] {
        let dir = TempDir::new("batch");
        let writes = concurrent_appends(&dir, fsync, groups, per_group).await;
        println!("fsync={fsync}: {appends} appends from {groups} groups took {writes} writes");
        assert!(writes < appends, "{writes} writes for {appends} appends");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_open_waits_for_the_first_to_close() {
    let dir = TempDir::new("lock");
    let first = open(&dir, false);
    append(&mut first.group(1), vec![blank(1, 1)]).await;
    let opened = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let second = {
        let path = log_dir(&dir.0);
        let opened = opened.clone();
        std::thread::spawn(move || {
            started_tx.send(()).unwrap();
            let log = NodeLog::open(Some(path), false);
            opened.store(true, Ordering::SeqCst);
            log
        })
    };
    started_rx.recv().unwrap();
    // Give the second open a chance to get ahead; it must not while the first is open.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        !opened.load(Ordering::SeqCst),
        "two logs open on one directory"
    );
    // The last change before closing is in the file the second one reads.
    append(&mut first.group(1), vec![blank(1, 2)]).await;
    drop(first);
    let second = second.join().unwrap().unwrap();
    assert_eq!(
        second.group(1).get_log_state().await.unwrap().last_log_id,
        Some(log_id(1, 2))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_while_compacting_in_the_background_are_kept() {
    // Without fsync the rewrite copies the live records on another thread while the groups
    // go on appending; what they wrote meanwhile must be in the new file, in place.
    let dir = TempDir::new("compact-bg");
    let entry_size = 1000;
    let count = COMPACT_MIN_BYTES / entry_size as u64;
    let (a, b) = (4, 5);
    {
        let log = open(&dir, false);
        fill(&log, &[a], count, entry_size).await;
        fill(&log, &[b], count, 50).await;
        let full = file_len(&log_file(&dir.0));
        // Most of the file dies at once: a compaction starts with the next write.
        log.group(a).purge(log_id(1, count - 1)).await.unwrap();
        // Meanwhile: more entries for both groups, a truncation and a vote.
        for i in 1..=200 {
            let mut sa = log.group(a);
            append(&mut sa, vec![normal(1, count + i, entry_size)]).await;
            let mut sb = log.group(b);
            append(&mut sb, vec![normal(1, count + i, 50)]).await;
        }
        log.group(b)
            .truncate_after(Some(log_id(1, count + 150)))
            .await
            .unwrap();
        log.group(b)
            .save_vote(&Vote::new_committed(7, 2))
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while file_len(&log_file(&dir.0)) >= full {
            writer_caught_up(&mut log.group(a)).await;
            assert!(std::time::Instant::now() < deadline, "log never compacted");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // And after it: the new file takes appends like the old one.
        let mut sa = log.group(a);
        append(&mut sa, vec![blank(2, count + 201)]).await;
    }
    let log = open(&dir, false);
    let mut sa = log.group(a);
    let entries = all_entries(&mut sa).await;
    assert_eq!(entries.first().map(|e| e.log_id), Some(log_id(1, count)));
    assert_eq!(
        entries.last().map(|e| e.log_id),
        Some(log_id(2, count + 201))
    );
    assert_eq!(entries.len() as u64, 202);
    let mut sb = log.group(b);
    let entries = all_entries(&mut sb).await;
    assert_eq!(entries.len() as u64, count + 150);
    assert_eq!(
        entries.last().map(|e| e.log_id),
        Some(log_id(1, count + 150))
    );
    assert_eq!(
        sb.read_vote().await.unwrap(),
        Some(Vote::new_committed(7, 2))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compactions_one_after_another_with_appends_throughout_keep_every_entry() {
    // Each background compaction copies what was appended while it ran after the live
    // records; the next compaction finds records by the places the first one gave them, so a
    // place (or the file's length) off by the bytes appended meanwhile shows here: as a
    // compaction that fails, or as a log that does not replay.
    let dir = TempDir::new("compact-bg-rounds");
    let entry_size = 1000;
    let per_round = 2 * COMPACT_MIN_BYTES / entry_size as u64;
    let (a, b) = (6, 7);
    let mut next_a = 1;
    let mut next_b = 1;
    {
        let log = open(&dir, false);
        for _round in 0..3 {
            let mut sa = log.group(a);
            for chunk in (next_a..next_a + per_round).collect::<Vec<_>>().chunks(100) {
                append(
                    &mut sa,
                    chunk.iter().map(|&i| normal(1, i, entry_size)).collect(),
                )
                .await;
            }
            next_a += per_round;
            let before = file_len(&log_file(&dir.0));
            // All but the last few entries of `a` die at once; `b` keeps appending until the
            // file has been rewritten, so appends land while the copy runs.
            sa.purge(log_id(1, next_a - 5)).await.unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            let mut sb = log.group(b);
            while file_len(&log_file(&dir.0)) >= before {
                append(&mut sb, vec![normal(1, next_b, 200)]).await;
                next_b += 1;
                assert!(std::time::Instant::now() < deadline, "log never compacted");
            }
            // A few more after the rewrite, placed by the new file's length.
            for _ in 0..20 {
                append(&mut sb, vec![normal(1, next_b, 200)]).await;
                next_b += 1;
            }
        }
    }
    let log = open(&dir, false);
    let entries = all_entries(&mut log.group(a)).await;
    assert_eq!(entries.len(), 4);
    assert_eq!(
        entries.last().map(|e| e.log_id),
        Some(log_id(1, next_a - 1))
    );
    let entries = all_entries(&mut log.group(b)).await;
    assert_eq!(entries.len() as u64, next_b - 1);
    assert_eq!(
        entries.last().map(|e| e.log_id),
        Some(log_id(1, next_b - 1))
    );
}

/// The entry a leader's log wrote comes back to its readers (the appends to the followers)
/// carrying the bytes the log wrote for it, the entry's own encoding; an entry that arrived
/// with its encoding is written from it, and reopening the log gives the same entries.
#[tokio::test]
async fn entries_read_back_carry_the_encoding_the_log_wrote() {
    let dir = TempDir::new("wire");
    let log = open(&dir, false);
    let mut store = log.group(5);
    let first = normal(1, 1, 40);
    let mut second = normal(1, 2, 40);
    let encoded =
        |e: &LogEntry| bincode::serde::encode_to_vec(e, bincode::config::standard()).unwrap();
    let (first_bytes, second_bytes) = (encoded(&first), encoded(&second));
    if let EntryPayload::Normal(p) = &mut second.payload {
        p.wire.0 = Some(Bytes::from(second_bytes.clone()));
    }
    append(&mut store, vec![first, second, blank(1, 3)]).await;
    let back = all_entries(&mut store).await;
    let wires: Vec<Option<Vec<u8>>> = back
        .iter()
        .map(|e| match &e.payload {
            EntryPayload::Normal(p) => p.wire.0.as_ref().map(|b| b.to_vec()),
            _ => None,
        })
        .collect();
    assert_eq!(wires, vec![Some(first_bytes), Some(second_bytes), None]);
    let before: Vec<Vec<u8>> = back.iter().map(encoded).collect();
    drop(store);
    drop(log);
    let log = open(&dir, false);
    let after: Vec<Vec<u8>> = all_entries(&mut log.group(5))
        .await
        .iter()
        .map(encoded)
        .collect();
    assert_eq!(after, before);
}
