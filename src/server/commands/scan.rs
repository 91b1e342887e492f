//! SCAN, walked by the node over its shards, one step of it on each shard at a time.

use super::{Failure, fail};
use crate::cmd::ScanCmd;
use crate::cmd::{KeyCmd, MISSING_REPLY, Reply, encode};
use crate::protocol::ReplyWriter;
use crate::server::session::Session;
use crate::store::SCAN_POSITION_BITS;

/// Bits of a SCAN cursor above the store's scan position: they name the shard.
const CURSOR_SHARD_SHIFT: u32 = SCAN_POSITION_BITS;

/// Runs SCAN: the cursor holds the shard in its top bits and the shard store's scan position below,
/// so scanning walks the shards in order and each shard's keys in the order of their hash; see
/// `Store::scan` for the guarantee.
pub(super) async fn run(s: &mut Session, cmd: ScanCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let ScanCmd {
        cursor,
        count,
        pattern,
        type_name,
    } = cmd;
    let n = s.node().shards.len();
    let mut shard = usize::try_from(cursor >> CURSOR_SHARD_SHIFT).unwrap_or(usize::MAX);
    let mut from = cursor & ((1u64 << CURSOR_SHARD_SHIFT) - 1);
    let mut examined = 0u64;
    let mut keys = Vec::new();
    while shard < n && examined < count {
        let cmd = KeyCmd::Scan {
            from,
            count: count - examined,
            pattern: pattern.clone(),
            type_name: type_name.clone(),
        };
        let reply = s.run_on_shard(shard, cmd).await?;
        let Some(Reply::Array(mut parts)) = reply.into_iter().next() else {
            return Err(fail(MISSING_REPLY));
        };
        let (Some(Reply::Array(found)), Some(Reply::Int(seen)), Some(Reply::Int(next))) =
            (parts.pop(), parts.pop(), parts.pop())
        else {
            return Err(fail("ERR internal error: malformed scan reply"));
        };
        examined += seen.unsigned_abs();
        keys.extend(found);
        match u64::try_from(next) {
            Ok(pos) => from = pos,
            Err(_) => {
                shard += 1;
                from = 0;
            }
        }
    }
    let next = if shard >= n {
        0
    } else {
        ((shard as u64) << CURSOR_SHARD_SHIFT) | from
    };
    let mut w = ReplyWriter::new(buf, s.resp3());
    w.array(2);
    w.bulk(next.to_string().as_bytes());
    encode(&mut w, &Reply::Array(keys));
    Ok(())
}
