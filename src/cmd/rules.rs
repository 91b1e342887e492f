//! BK.RULE: named limits, kept by the node. Its entry and how its arguments parse into a
//! `RuleCmd`; `run` runs it against the node's rule set.

use super::node::{Failure, msg as fail};
use super::table::{CommandSpec, Parser, command};
use super::{Finish, NodeCmd, Trailing, msg};
use crate::cluster::meta::MetaOp;
use crate::cmd::keyed::Reply;
use crate::protocol::ReplyWriter;
use crate::protocol::{ArgError, Args};
use crate::rules::NamedRule;
use crate::server::conn::Conn;

/// BK.RULE SET|GET|DEL|LIST|RELOAD, parsed.
pub enum RuleCmd {
    /// SET name spec: `spec` must be inline.
    Set {
        name: String,
        rule: NamedRule,
    },
    Get(String),
    Del(String),
    List,
    /// Reads the rules file again.
    Reload,
}

pub(super) const COMMANDS: &[CommandSpec] = &[command! {
    name: "bk.rule",
    arity: -2,
    flags: ["admin"],
    keys: (0, 0, 0),
    acl: ["@admin", "@ratelimit"],
    group: "ratelimit",
    summary: "Named rules: BK.RULE SET|GET|DEL|LIST|RELOAD (a spec starting shadow: is a rule in shadow mode).",
    parse: Parser::Node(parse_rule),
}];

fn parse_rule(a: &mut Args) -> Result<NodeCmd, ArgError> {
    let sub = a.next_keyword()?;
    let cmd = match sub.as_str() {
        "SET" => {
            let name = a.next_string()?;
            let spec = a.next_bytes()?;
            a.finish_as(Trailing::Syntax)?;
            if !spec.contains(&b'/') {
                return Err(msg("ERR a rule needs an inline spec such as 100/1m"));
            }
            let text = std::str::from_utf8(&spec).map_err(|_| msg("ERR invalid limit spec"))?;
            let rule = NamedRule::parse(text).map_err(|e| {
                msg(format!(
                    "ERR invalid limit spec '{}': {e}",
                    super::truncate(text)
                ))
            })?;
            RuleCmd::Set { name, rule }
        }
        "GET" | "DEL" => {
            let name = a.next_string()?;
            a.finish_as(Trailing::Syntax)?;
            if sub == "GET" {
                RuleCmd::Get(name)
            } else {
                RuleCmd::Del(name)
            }
        }
        "LIST" => {
            a.finish_as(Trailing::Syntax)?;
            RuleCmd::List
        }
        "RELOAD" => {
            a.finish_as(Trailing::Syntax)?;
            RuleCmd::Reload
        }
        other => {
            return Err(msg(format!(
                "ERR unknown subcommand '{other}' for BK.RULE: use SET, GET, DEL, LIST or RELOAD"
            )));
        }
    };
    Ok(NodeCmd::Rule(cmd))
}

/// Runs BK.RULE against the node's rule set; in a cluster, changes go through the cluster's
/// metadata, so every node sees them.
pub(crate) async fn run(c: &mut Conn, cmd: RuleCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    if let Some(cluster) = c.node().cluster().cloned() {
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
                let n = c.node().rules.reload().map_err(|e| {
                    fail(format!("ERR rules not reloaded, previous rules kept: {e}"))
                })?;
                let specs = c.node().rules.load().specs();
                cluster
                    .propose_meta(MetaOp::LoadRules(specs))
                    .await
                    .map_err(|e| fail(cluster.error_reply(0, &e)))?;
                ReplyWriter::new(buf, c.resp3()).int(n as i64);
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
            let mut w = ReplyWriter::new(buf, c.resp3());
            match reply {
                Reply::Int(n) => w.int(n),
                Reply::Error(e) => return Err(fail(e.into_owned())),
                _ => w.ok(),
            }
            return Ok(());
        }
    }
    let rules = &c.node().rules;
    let mut w = ReplyWriter::new(buf, c.resp3());
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
