//! BK.RULE: named limits, kept by the node. Its entry and how its arguments parse into a
//! `RuleCmd`; the node runs it (`server::node_cmds`) against its rule set.

use super::table::{CommandSpec, Parser, command};
use super::{Finish, NodeCmd, Trailing, msg, resolve_spec};
use crate::limiter::Rule;
use crate::protocol::{ArgError, Args};

/// BK.RULE SET|GET|DEL|LIST|RELOAD, parsed.
pub enum RuleCmd {
    /// SET name spec: `spec` must be inline.
    Set {
        name: String,
        rule: Rule,
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
    summary: "Named rules: BK.RULE SET|GET|DEL|LIST|RELOAD.",
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
            let rule = resolve_spec(&spec, &crate::rules::RuleSet::default())?;
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
