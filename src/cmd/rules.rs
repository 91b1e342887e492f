//! BK.RULE: named limits, kept by the node. Its entry and how its arguments parse into a
//! `RuleCmd`; the server runs it against the node's rule set.

use super::table::{CommandSpec, Parser, command};
use super::{Finish, NodeCmd, Trailing, msg};
use crate::protocol::{ArgError, Args};
use crate::rules::NamedRule;

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
