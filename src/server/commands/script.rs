//! SCRIPT LOAD|EXISTS|FLUSH, run on the node's script cache and, in a cluster, on every
//! member's.

use super::{Failure, fail};
use crate::cluster::ScriptsChange;
use crate::cmd::{ScriptCmd, check_compiles, sha1_hex};
use crate::protocol::ReplyWriter;
use crate::server::session::Session;

/// Runs SCRIPT on this node's cache. In a cluster, LOAD and FLUSH are made on every member
/// before the reply: a script is the cluster's, so a client that loaded it through one node
/// can run it on whichever node leads its keys, now and after a failover.
pub(super) async fn run(s: &mut Session, cmd: ScriptCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let node = s.node();
    let scripts = &node.scripts;
    let cluster = node.cluster();
    let mut w = ReplyWriter::new(buf, s.resp3());
    match cmd {
        ScriptCmd::Load(body) => {
            // Compiled here first, so a script that does not compile is refused at once, as
            // Redis refuses it.
            let sha = sha1_hex(&body);
            if let Err(e) = check_compiles(&body) {
                return Err(fail(e.to_string()));
            }
            scripts.insert(sha.clone(), body.clone());
            if let Some(cluster) = cluster {
                cluster
                    .share_scripts(ScriptsChange::Load(body.to_vec()))
                    .await;
            }
            w.bulk(&sha);
        }
        ScriptCmd::Exists(shas) => {
            w.array(shas.len());
            for sha in shas {
                w.int(i64::from(scripts.get(&sha.to_ascii_lowercase()).is_some()));
            }
        }
        ScriptCmd::Flush => {
            scripts.clear();
            if let Some(cluster) = cluster {
                cluster.share_scripts(ScriptsChange::Flush).await;
            }
            w.ok();
        }
    }
    Ok(())
}
