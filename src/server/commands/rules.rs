//! BK.RULE, run against the node's rule set: in a cluster, changes go through the cluster's
//! metadata.

use super::{Failure, fail};
use crate::cluster::MetaOp;
use crate::cmd::Reply;
use crate::cmd::RuleCmd;
use crate::protocol::ReplyWriter;
use crate::server::session::Session;

/// Runs BK.RULE against the node's rule set; in a cluster, changes go through the cluster's
/// metadata, so every node sees them.
pub(super) async fn run(s: &mut Session, cmd: RuleCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    if let Some(cluster) = s.node().cluster().cloned() {
        let op = match &cmd {
            RuleCmd::Set { name, rule } => {
                crate::rules::validate_name(name).map_err(|e| fail(format!("ERR {e}")))?;
                Some(MetaOp::SetRule {
                    name: name.clone(),
                    spec: rule.to_string(),
                })
            }
            RuleCmd::Del(name) => Some(MetaOp::DelRule(name.clone())),
            RuleCmd::Reload => {
                let n = s.node().rules.reload().map_err(|e| {
                    fail(format!("ERR rules not reloaded, previous rules kept: {e}"))
                })?;
                let specs = s.node().rules.load().specs();
                cluster
                    .propose_meta(MetaOp::LoadRules(specs))
                    .await
                    .map_err(|e| fail(cluster.error_reply(0, &e)))?;
                ReplyWriter::new(buf, s.resp3()).int(n as i64);
                return Ok(());
            }
            RuleCmd::Get(_) | RuleCmd::List => None,
        };
        if let Some(op) = op {
            let reply = cluster
                .propose_meta(op.clone())
                .await
                .map_err(|e| fail(cluster.error_reply(0, &e)))?;
            // The reply came from the metadata group's leader: wait (briefly) until this node
            // applied the change too (which puts the rules in force here), so the client reads
            // its own write here.
            let _ = cluster
                .await_meta(
                    |m| match &op {
                        MetaOp::SetRule { name, spec } => m.rules.get(name) == Some(spec),
                        MetaOp::DelRule(name) => !m.rules.contains_key(name),
                        _ => true,
                    },
                    std::time::Duration::from_secs(1),
                )
                .await;
            let mut w = ReplyWriter::new(buf, s.resp3());
            match reply {
                Reply::Int(n) => w.int(n),
                Reply::Error(e) => return Err(fail(e.into_owned())),
                _ => w.ok(),
            }
            return Ok(());
        }
    }
    let rules = &s.node().rules;
    let mut w = ReplyWriter::new(buf, s.resp3());
    match cmd {
        RuleCmd::Set { name, rule } => {
            rules
                .set(&name, rule)
                .map_err(|e| fail(format!("ERR {e}")))?;
            w.ok();
        }
        RuleCmd::Get(name) => match rules.load().named(&name) {
            Some(r) => w.bulk(r.to_string().as_bytes()),
            None => w.null(),
        },
        RuleCmd::Del(name) => w.int(i64::from(rules.remove(&name))),
        RuleCmd::List => {
            let set = rules.load();
            let sorted = set.sorted();
            w.map(sorted.len());
            for (name, r) in sorted {
                w.kv_str(name, &r.to_string());
            }
        }
        RuleCmd::Reload => {
            let n = rules
                .reload()
                .map_err(|e| fail(format!("ERR rules not reloaded, previous rules kept: {e}")))?;
            w.int(n as i64);
        }
    }
    Ok(())
}
