//! BK.RULE: named limits, kept by the node.

use super::table::{CommandSpec, Parser, command};

pub(super) const COMMANDS: &[CommandSpec] = &[command! {
    name: "bk.rule",
    arity: -2,
    flags: ["admin"],
    keys: (0, 0, 0),
    acl: ["@admin", "@ratelimit"],
    group: "ratelimit",
    summary: "Named rules: BK.RULE SET|GET|DEL|LIST|RELOAD.",
    parse: Parser::Node,
}];
