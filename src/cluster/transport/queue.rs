//! What is queued for one peer's writer, bounded in frames and in bytes: past either bound a
//! frame is refused at once (`QueueRefused::Full`) rather than queued, so a peer that stops
//! reading costs this node a known amount of memory instead of everything sent to it until the
//! connection fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::mpsc;

/// Most bytes of encoded frames queued for one peer (in either direction: requests to it,
/// answers to its requests) that its writer has not taken yet.
///
/// A peer that keeps up drains its queue every turn of the event loop, and a turn queues far
/// less than this: a heartbeat for every group is a few KiB, a turn's appends at most a few
/// MiB. A peer that stops reading (a stalled process, a link the kernel has not yet found
/// dead) is what fills it, and then the budget is what it costs this node in memory, per peer,
/// instead of everything sent to it until the connection fails. 64 MiB is 64 of the writer's
/// 1 MiB batches: well above any honest backlog, small next to a node's memory even with
/// every peer stalled at once. A frame larger than the whole budget (a big group's snapshot)
/// is still queued when nothing else is, so it can always be sent.
const PEER_QUEUE_BYTES: usize = 64 << 20;

/// Most frames queued for one peer, whatever their size: bounds the count of small frames (a
/// heartbeat is about a hundred bytes) that the byte budget alone would let pile up.
const PEER_QUEUE_FRAMES: usize = 64 * 1024;

/// Most bytes the writer gathers into one write.
const WRITE_BATCH: usize = 1 << 20;

/// Why a frame was not queued.
pub(super) enum QueueRefused {
    /// The queue holds `PEER_QUEUE_BYTES` or `PEER_QUEUE_FRAMES` already.
    Full,
    /// Its writer has stopped.
    Closed,
}

/// The sending end of the frames queued for one peer's writer, bounded in frames and bytes.
#[derive(Clone)]
pub(super) struct QueueTx {
    tx: mpsc::Sender<Vec<u8>>,
    /// Bytes queued and not yet taken by the writer.
    bytes: Arc<AtomicUsize>,
}

/// The writer's end of a peer's queue.
pub(super) struct QueueRx {
    rx: mpsc::Receiver<Vec<u8>>,
    bytes: Arc<AtomicUsize>,
}

pub(super) fn peer_queue() -> (QueueTx, QueueRx) {
    let (tx, rx) = mpsc::channel(PEER_QUEUE_FRAMES);
    let bytes = Arc::new(AtomicUsize::new(0));
    (
        QueueTx {
            tx,
            bytes: bytes.clone(),
        },
        QueueRx { rx, bytes },
    )
}

impl QueueTx {
    /// Queues `frame` unless the queue is full; never waits.
    pub(super) fn push(&self, frame: Vec<u8>) -> Result<(), QueueRefused> {
        let len = frame.len();
        let before = self.bytes.fetch_add(len, Ordering::Relaxed);
        // An empty queue takes any frame, so one larger than the budget can still go.
        if before != 0 && before + len > PEER_QUEUE_BYTES {
            self.bytes.fetch_sub(len, Ordering::Relaxed);
            return Err(QueueRefused::Full);
        }
        self.tx.try_send(frame).map_err(|e| {
            self.bytes.fetch_sub(len, Ordering::Relaxed);
            match e {
                mpsc::error::TrySendError::Full(_) => QueueRefused::Full,
                mpsc::error::TrySendError::Closed(_) => QueueRefused::Closed,
            }
        })
    }

    pub(super) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

impl QueueRx {
    /// Waits for the next frame; `None` once the queue is closed and empty. Cancel safe.
    pub(super) async fn recv(&mut self) -> Option<Vec<u8>> {
        self.rx.recv().await
    }

    /// Puts `first` (just received) into `batch` (cleared first) with every frame queued
    /// behind it, up to `WRITE_BATCH` bytes, and returns how many frames that is.
    pub(super) async fn batch_after(&mut self, first: Vec<u8>, batch: &mut Vec<u8>) -> u64 {
        batch.clear();
        batch.extend_from_slice(&first);
        let mut taken = first.len();
        // Let the other groups' tasks that are ready run first, so what they queue for this
        // peer rides in the same write.
        tokio::task::yield_now().await;
        let mut n = 1;
        while batch.len() < WRITE_BATCH {
            match self.rx.try_recv() {
                Ok(more) => {
                    batch.extend_from_slice(&more);
                    taken += more.len();
                    n += 1;
                }
                Err(_) => break,
            }
        }
        self.bytes.fetch_sub(taken, Ordering::Relaxed);
        n
    }

    pub(super) fn close(&mut self) {
        self.rx.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_peer_queue_refuses_past_its_byte_budget_and_takes_any_frame_when_empty() {
        let (tx, mut rx) = peer_queue();
        // A frame larger than the whole budget still goes when nothing else is queued.
        assert!(tx.push(vec![0; PEER_QUEUE_BYTES + 1]).is_ok());
        assert!(matches!(tx.push(vec![0; 1]), Err(QueueRefused::Full)));
        let mut batch = Vec::new();
        let first = rx.recv().await.unwrap();
        assert_eq!(rx.batch_after(first, &mut batch).await, 1);
        // Taken by the writer, its bytes no longer count.
        assert!(tx.push(vec![0; PEER_QUEUE_BYTES / 2]).is_ok());
        assert!(tx.push(vec![0; PEER_QUEUE_BYTES / 2]).is_ok());
        assert!(matches!(tx.push(vec![0; 1]), Err(QueueRefused::Full)));
        let (tx, rx) = peer_queue();
        drop(rx);
        assert!(matches!(tx.push(vec![0; 1]), Err(QueueRefused::Closed)));
        assert_eq!(tx.bytes.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_peer_queue_refuses_past_its_frame_count() {
        let (tx, _rx) = peer_queue();
        for _ in 0..PEER_QUEUE_FRAMES {
            assert!(tx.push(vec![0; 8]).is_ok());
        }
        assert!(matches!(tx.push(vec![0; 8]), Err(QueueRefused::Full)));
        // A refused frame leaves the byte count as it was.
        assert_eq!(tx.bytes.load(Ordering::Relaxed), PEER_QUEUE_FRAMES * 8);
    }
}
