//! SCAN, walked by the node over its shards, one step of it on each shard at a time.

use super::{Failure, fail};
use crate::cmd::{Cursor, MISSING_REPLY, ScanCmd, encode, scan_reply};
use crate::protocol::ReplyWriter;
use crate::server::session::Session;

/// Runs SCAN over the node's shards, one step on each shard at a time.
pub(super) async fn run(s: &mut Session, cmd: ScanCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let n = s.node().shards.len();
    let mut at = Cursor::of(cmd.cursor);
    let (mut examined, mut keys) = (0u64, Vec::new());
    while at.shard < n && examined < cmd.count {
        let reply = s
            .run_on_shard(at.shard, at.step_cmd(&cmd, examined))
            .await?;
        let reply = reply
            .into_iter()
            .next()
            .ok_or_else(|| fail(MISSING_REPLY))?;
        examined += at.advance(reply, &mut keys).map_err(fail)?;
    }
    encode(
        &mut ReplyWriter::new(buf, s.resp3()),
        &scan_reply(at.wire(n), keys),
    );
    Ok(())
}
