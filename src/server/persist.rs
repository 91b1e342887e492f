//! A standalone node's keys across restarts: a snapshot file in `--data-dir`, written every
//! `--save-interval` seconds and at shutdown, and loaded when the node starts.
//!
//! The file (`dump.bkd`) is a header and the node's limit time when it was saved (`u64`, and
//! its `u32` CRC-32C), then one chunk per store partition of each shard
//! (`u32` length, `u32` CRC-32C of the body, the body: bincode of the partition's records),
//! then a trailer with the number of records and its own checksum. A snapshot is written to
//! a temporary file, synced and renamed over the old one, so a crash while saving leaves the
//! previous snapshot whole. A file that does not check out (a bad header, a checksum, a
//! missing trailer: a torn copy) is refused with the file's name, and the node does not start
//! empty by surprise.
//!
//! Each shard copies its keys out one partition at a time and serves its clients between
//! partitions. Each key is saved as it was when its partition was copied.
//!
//! The saved time is a floor for the node's time once it loads the file: a node restarted
//! after its wall clock stepped back resumes its limits from where they were, rather than
//! counting the step as time still to wait. (Files of the first format, `BKDSNAP1`, hold no
//! time and are still read.)

use super::Node;
use crate::error::StartError;
use crate::shard::ShardMsg;
use crate::shutdown::Shutdown;
use crate::store::{Record, Store};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// The snapshot's name in the data directory.
pub(crate) const FILE: &str = "dump.bkd";
const HEADER: &[u8; 8] = b"BKDSNAP2";
/// The first format's header: no time follows it.
const HEADER_V1: &[u8; 8] = b"BKDSNAP1";
const TRAILER: &[u8; 8] = b"BKDEND01";
/// Largest chunk a reader accepts: one partition of one shard, far above what a partition
/// holds (the store splits a shard's keys over many partitions).
const MAX_CHUNK: usize = 1 << 30;

pub(crate) fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

fn bincode_config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Why a snapshot could not be saved; the keys in memory are untouched.
#[derive(Debug)]
pub(crate) enum SaveError {
    /// A shard stopped before it handed over its keys.
    ShardStopped,
    /// A partition's keys did not encode.
    Encode(bincode::error::EncodeError),
    /// A partition's keys encode to more than a chunk can say.
    TooLarge,
    /// The file could not be written.
    Write(std::io::Error),
    /// The task writing the file failed.
    Task(tokio::task::JoinError),
}

impl std::fmt::Display for SaveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SaveError::ShardStopped => f.write_str("a shard stopped"),
            SaveError::Encode(e) => write!(f, "{e}"),
            SaveError::TooLarge => f.write_str("a partition is too large"),
            SaveError::Write(e) => write!(f, "{e}"),
            SaveError::Task(e) => write!(f, "{e}"),
        }
    }
}

/// Copies every shard's keys, a partition at a time, into the snapshot's bytes.
async fn encode(node: &Node) -> Result<(Vec<u8>, u64), SaveError> {
    let mut out = Vec::with_capacity(1 << 20);
    out.extend_from_slice(HEADER);
    let now = node.now();
    out.extend_from_slice(&now.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&now.to_le_bytes()).to_le_bytes());
    let mut count: u64 = 0;
    for shard in &node.shards {
        for part in 0..Store::partitions() {
            let (reply, rx) = oneshot::channel();
            shard
                .send(ShardMsg::ExportPart { part, now, reply })
                .await
                .map_err(|_| SaveError::ShardStopped)?;
            let records = rx.await.map_err(|_| SaveError::ShardStopped)?;
            if records.is_empty() {
                continue;
            }
            count += records.len() as u64;
            let body = bincode::serde::encode_to_vec(&records, bincode_config())
                .map_err(SaveError::Encode)?;
            let len = u32::try_from(body.len()).map_err(|_| SaveError::TooLarge)?;
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
            out.extend_from_slice(&body);
        }
    }
    out.extend_from_slice(TRAILER);
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&count.to_le_bytes()).to_le_bytes());
    Ok((out, count))
}

/// Writes `bytes` as the snapshot, atomically: a temporary file, synced, renamed over the
/// old one, and the directory synced.
fn write_atomically(dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path(dir))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Takes a snapshot now; returns the number of keys saved.
pub(crate) async fn save(node: &Node, dir: &Path) -> Result<u64, SaveError> {
    let (bytes, count) = encode(node).await?;
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || write_atomically(&dir, &bytes))
        .await
        .map_err(SaveError::Task)?
        .map_err(SaveError::Write)?;
    Ok(count)
}

/// A snapshot's content: the node's time when it was saved (0 in the first format) and its
/// keys.
pub(crate) struct Dump {
    pub(crate) saved_at: u64,
    pub(crate) records: Vec<Record>,
}

/// Reads and checks a snapshot's bytes.
pub(crate) fn decode(bytes: &[u8]) -> Result<Dump, String> {
    let (saved_at, rest) = if let Some(rest) = bytes.strip_prefix(HEADER.as_slice()) {
        let (time, crc) = match (rest.get(..8), rest.get(8..12)) {
            (Some(t), Some(c)) => (t, c),
            _ => return Err("the file ends inside its header (a torn copy)".into()),
        };
        if crc32c::crc32c(time).to_le_bytes() != crc {
            return Err("the saved time's checksum does not match".into());
        }
        let mut t = [0u8; 8];
        t.copy_from_slice(time);
        (u64::from_le_bytes(t), &rest[12..])
    } else if let Some(rest) = bytes.strip_prefix(HEADER_V1.as_slice()) {
        (0, rest)
    } else {
        return Err("not a bucketd snapshot (bad header)".into());
    };
    let records = decode_chunks(rest)?;
    Ok(Dump { saved_at, records })
}

/// The chunks and trailer after the header.
fn decode_chunks(rest: &[u8]) -> Result<Vec<Record>, String> {
    let mut at = 0usize;
    let mut records = Vec::new();
    loop {
        let left = &rest[at..];
        if let Some(t) = left.strip_prefix(TRAILER.as_slice()) {
            let (count, crc) = match (t.get(..8), t.get(8..12)) {
                (Some(c), Some(k)) if t.len() == 12 => (c, k),
                _ => return Err("the trailer is damaged".into()),
            };
            if crc32c::crc32c(count).to_le_bytes() != crc {
                return Err("the trailer's checksum does not match".into());
            }
            let mut n = [0u8; 8];
            n.copy_from_slice(count);
            if u64::from_le_bytes(n) != records.len() as u64 {
                return Err(format!(
                    "the trailer counts {} keys, the file holds {}",
                    u64::from_le_bytes(n),
                    records.len()
                ));
            }
            return Ok(records);
        }
        let head = left
            .get(..8)
            .ok_or("the file ends without its trailer (a torn copy)")?;
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if len > MAX_CHUNK {
            return Err(format!("a chunk claims {len} bytes"));
        }
        let body = left
            .get(8..8 + len)
            .ok_or("the file ends inside a chunk (a torn copy)")?;
        if crc32c::crc32c(body) != crc {
            return Err(format!(
                "a chunk's checksum does not match (at byte {})",
                at + 8
            ));
        }
        let (chunk, used): (Vec<Record>, usize) = crate::cluster::decode_bounded(body)
            .map_err(|e| format!("a chunk does not decode: {e}"))?;
        if used != body.len() {
            return Err("a chunk has bytes after its records".into());
        }
        records.extend(chunk);
        at += 8 + len;
    }
}

/// Loads the snapshot in `dir`, if there is one, into the shards; returns the keys loaded.
pub(crate) async fn load(node: &Node, dir: &Path) -> Result<u64, StartError> {
    let file = path(dir);
    let refuse = |reason: String| StartError::Dump {
        path: file.clone(),
        reason,
    };
    let bytes = match std::fs::read(&file) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(refuse(e.to_string())),
    };
    let Dump { saved_at, records } = decode(&bytes).map_err(refuse)?;
    drop(bytes);
    // The keys were saved at `saved_at`: time here resumes from there at least.
    crate::sync::lock(&node.time).raise(saved_at);
    for shard in &node.shards {
        let (reply, rx) = oneshot::channel();
        shard
            .send(ShardMsg::RaiseTime {
                at: saved_at,
                reply,
            })
            .await
            .map_err(|_| StartError::ShardStopped)?;
        rx.await.map_err(|_| StartError::ShardStopped)?;
    }
    let count = records.len() as u64;
    let mut by_shard: Vec<Vec<Record>> = node.shards.iter().map(|_| Vec::new()).collect();
    for r in records {
        let s = node.shard_of(&r.key);
        if let Some(v) = by_shard.get_mut(s) {
            v.push(r);
        }
    }
    for (shard, records) in node.shards.iter().zip(by_shard) {
        let (reply, rx) = oneshot::channel();
        shard
            .send(ShardMsg::Import {
                slots: (0, crate::slot::SLOTS - 1),
                records,
                reply,
            })
            .await
            .map_err(|_| StartError::ShardStopped)?;
        rx.await.map_err(|_| StartError::ShardStopped)?;
    }
    Ok(count)
}

/// Saves a snapshot every `every` until shutdown (the one at shutdown is `NodeHandle`'s).
pub(crate) async fn save_every(
    node: Arc<Node>,
    dir: PathBuf,
    every: Duration,
    mut shutdown: Shutdown,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.recv() => return,
        }
        let started = std::time::Instant::now();
        match save(&node, &dir).await {
            Ok(n) => tracing::debug!(
                keys = n,
                ms = started.elapsed().as_millis() as u64,
                "snapshot saved"
            ),
            Err(e) => tracing::warn!("snapshot to {} failed: {e}", dir.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::OwnedValue;

    fn sample() -> Vec<u8> {
        let records = vec![
            Record {
                key: b"a".to_vec(),
                value: OwnedValue::Int(7),
                expires_at: 0,
            },
            Record {
                key: b"b".to_vec(),
                value: OwnedValue::Str(b"xyz".to_vec()),
                expires_at: 5,
            },
        ];
        let body = bincode::serde::encode_to_vec(&records, bincode_config()).unwrap();
        let mut out = HEADER.to_vec();
        out.extend_from_slice(&77u64.to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&77u64.to_le_bytes()).to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(TRAILER);
        out.extend_from_slice(&2u64.to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&2u64.to_le_bytes()).to_le_bytes());
        out
    }

    #[test]
    fn a_whole_snapshot_reads_back() {
        let d = decode(&sample()).unwrap();
        assert_eq!(d.saved_at, 77);
        let r = d.records;
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].value, OwnedValue::Str(b"xyz".to_vec()));
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_refused() {
        let good = sample();
        for cut in 0..good.len() {
            assert!(decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_err(), "byte {i} flipped");
        }
    }

    #[test]
    fn the_first_format_reads_back_without_a_time() {
        let v2 = sample();
        let mut v1 = HEADER_V1.to_vec();
        v1.extend_from_slice(&v2[20..]);
        let d = decode(&v1).unwrap();
        assert_eq!((d.saved_at, d.records.len()), (0, 2));
    }
}
