//! Framing: a message travels as one frame prefixed with its `u32` length, or as several
//! when it is larger than `FRAME_CAP`, and a reader's buffer grows only as bytes arrive, so a
//! header alone makes this node reserve nothing.

use tokio::io::{AsyncRead, AsyncReadExt};

/// What one read from a peer's connection takes in at most.
pub(super) const PEER_READ_BUF: usize = 64 * 1024;

/// Largest frame a peer may send: a message larger than this travels in several frames.
///
/// What the protocol sends in one message: a heartbeat or a ping is about a hundred bytes; an
/// append carries at most openraft's `max_payload_entries` (300) entries, each one turn's
/// commands of one group, a few KiB of rate-limit checks; a forwarded batch is one client
/// round (at most 1024 commands). Honest messages other than snapshots stay well under 1 MiB.
/// 16 MiB leaves room for a round of large SET values (bulk strings are capped at 8 MiB by
/// default) without letting one header make this node reserve much memory: and nothing is
/// reserved before the bytes arrive anyway (`read_growing`).
pub(super) const FRAME_CAP: usize = 16 << 20;

/// Set in a frame's length word when the message goes on in the next frame.
const MORE_FRAMES: u32 = 1 << 31;

/// Largest message reassembled from frames: a snapshot of a large group. Reached only as bytes
/// arrive (a peer must send them all), and only past the handshake.
pub(super) const MESSAGE_CAP: usize = 1 << 30;

/// Most bytes read into a frame's buffer at a time: the buffer grows by what arrived, not by
/// what the header claims.
const READ_STEP: usize = 64 * 1024;

/// A buffer kept for the next frame is given back when it grew past this (a snapshot).
const KEEP_BUF: usize = 1 << 20;

/// A message larger than `MESSAGE_CAP` bytes (its length): no peer would take it.
#[derive(Debug)]
pub(super) struct MessageTooLarge(pub(super) usize);

/// Frames what `body` appends to `out`: one length-prefixed frame, or several when it is
/// larger than `FRAME_CAP`. On an error `out` is left as it was.
pub(super) fn encode_with<E: From<MessageTooLarge>>(
    out: &mut Vec<u8>,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<(), E> {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    if let Err(e) = body(out) {
        out.truncate(start);
        return Err(e);
    }
    let len = out.len() - start - 4;
    if len > MESSAGE_CAP {
        out.truncate(start);
        return Err(MessageTooLarge(len).into());
    }
    if len <= FRAME_CAP {
        // `len` fits: it is at most FRAME_CAP, far below the MORE_FRAMES bit.
        out[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
        return Ok(());
    }
    let body = out.split_off(start + 4);
    out.truncate(start);
    let mut pieces = body.chunks(FRAME_CAP).peekable();
    while let Some(piece) = pieces.next() {
        let mut word = piece.len() as u32;
        if pieces.peek().is_some() {
            word |= MORE_FRAMES;
        }
        out.extend_from_slice(&word.to_le_bytes());
        out.extend_from_slice(piece);
    }
    Ok(())
}

/// Why a peer's bytes were not a message.
#[derive(Debug)]
pub(super) enum ReadError {
    /// The connection closed or failed.
    Io(std::io::Error),
    /// A frame's header claims more than `FRAME_CAP`, or a message more than `MESSAGE_CAP`.
    TooLarge(usize),
    /// The bytes are not a message, in bincode's words.
    Decode(bincode::error::DecodeError),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => e.fmt(f),
            ReadError::TooLarge(n) => write!(f, "frame of {n} bytes is over the cap"),
            ReadError::Decode(e) => write!(f, "undecodable frame: {e}"),
        }
    }
}

/// Appends exactly `n` more bytes from `r` to `buf`, growing it by what arrives (at most
/// `READ_STEP` at a time) rather than by what was announced.
async fn read_growing(
    r: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
    n: usize,
) -> std::io::Result<()> {
    let end = buf.len() + n;
    while buf.len() < end {
        let step = (end - buf.len()).min(READ_STEP);
        buf.reserve(step);
        let got = (&mut *r).take(step as u64).read_buf(buf).await?;
        if got == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// Reads one message's bytes (one frame, or several with `MORE_FRAMES`) into `buf`, in place
/// of what it held.
pub(super) async fn read_message(
    r: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> Result<(), ReadError> {
    if buf.capacity() > KEEP_BUF {
        *buf = Vec::new();
    }
    buf.clear();
    loop {
        let mut word = [0u8; 4];
        r.read_exact(&mut word).await.map_err(ReadError::Io)?;
        let word = u32::from_le_bytes(word);
        let len = (word & !MORE_FRAMES) as usize;
        if len > FRAME_CAP {
            return Err(ReadError::TooLarge(len));
        }
        if buf.len() + len > MESSAGE_CAP {
            return Err(ReadError::TooLarge(buf.len() + len));
        }
        read_growing(r, buf, len).await.map_err(ReadError::Io)?;
        if word & MORE_FRAMES == 0 {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message larger than a frame travels in several and comes back whole; a header over
    /// the cap is refused before anything is read or reserved for it.
    #[tokio::test]
    async fn large_messages_are_split_into_capped_frames() {
        let big = vec![b'x'; FRAME_CAP * 2 + 17];
        let mut bytes = Vec::new();
        encode_with(&mut bytes, |out| {
            out.extend_from_slice(&big);
            Ok::<(), MessageTooLarge>(())
        })
        .unwrap();
        let first = u32::from_le_bytes(bytes[..4].try_into().unwrap());
        assert_eq!(first, FRAME_CAP as u32 | MORE_FRAMES);
        let mut buf = Vec::new();
        read_message(&mut bytes.as_slice(), &mut buf).await.unwrap();
        assert!(buf == big);
        let mut over = Vec::new();
        over.extend_from_slice(&(FRAME_CAP as u32 + 1).to_le_bytes());
        let mut buf = Vec::new();
        assert!(matches!(
            read_message(&mut over.as_slice(), &mut buf).await,
            Err(ReadError::TooLarge(_))
        ));
        assert_eq!(buf.capacity(), 0);
    }
}
