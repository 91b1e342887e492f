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
//! a file past `COMPACT_MIN_BYTES` is more than `COMPACT_RATIO` times its live records, the
//! writer rewrites it as, for each group, its latest purge marker, vote and committed log id
//! followed by its live entries, into `log.bin.tmp`, which is renamed over `log.bin` (with
//! fsync on, the copy is fsynced before the rename and the directory after it). A crash at any
//! point leaves the old file or the new one, both whole. Without fsync the copy is made on a
//! blocking thread while the groups go on appending to the old file (`log.bin.compact`); then,
//! under the writer's lock, what was appended meanwhile is copied after it, every record's
//! place is carried over, and the copy is renamed over `log.bin`, so a rewrite never stalls an
//! event loop.
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
//!
//! The code follows these seams: `format` (records, replay, where live records sit), `writer`
//! (the one owner of the file: batching, fsync, compaction) and `storage` (openraft's log
//! storage and reader over them).

mod format;
mod storage;
mod writer;

pub use format::{COMPACT_MIN_BYTES, COMPACT_RATIO};
pub use storage::{GroupLog, NodeLog};

/// Replays the contents of a `log.bin` as opening the log does, without touching the disk:
/// how many of its bytes hold whole records (what follows is a torn tail, cut off at open),
/// or why the file cannot be opened.
pub fn replay_len(bytes: &[u8]) -> std::io::Result<u64> {
    format::replay(bytes).map(|r| r.valid_len)
}
