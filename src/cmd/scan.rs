//! SCAN: its entry, and the step of it each shard runs. The cursor names a shard in its top
//! bits and the shard store's scan position below.

use super::keyed::Reply;
use super::table::{CommandSpec, Parser, command};
use crate::store::{Store, Value};
use bytes::Bytes;

pub(super) const COMMANDS: &[CommandSpec] = &[command! {
    name: "scan",
    arity: -2,
    flags: ["readonly"],
    keys: (0, 0, 0),
    acl: ["@keyspace", "@read", "@slow"],
    group: "generic",
    summary: "Iterates over the key names: SCAN cursor [MATCH pattern] [COUNT n] [TYPE type].",
    barrier: true,
    parse: Parser::Node,
}];

/// One shard's step of SCAN from scan position `from`: replies
/// `[next position or -1 when done, keys examined, [keys...]]`. `type_name` is matched as
/// TYPE names it (`string`, `bucket`), in any case.
pub(super) fn step(
    store: &Store,
    from: u64,
    count: u64,
    pattern: Option<&[u8]>,
    type_name: Option<&[u8]>,
    now: u64,
) -> Reply {
    let mut keys = Vec::new();
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    let step = store.scan(from, count, now, |k, v| {
        let kind: &[u8] = if matches!(v, Value::Bucket(_)) {
            b"bucket"
        } else {
            b"string"
        };
        if pattern.is_none_or(|p| crate::glob::matches(p, k))
            && type_name.is_none_or(|t| t.eq_ignore_ascii_case(kind))
        {
            keys.push(Reply::Bulk(Bytes::copy_from_slice(k)));
        }
    });
    let next = step.next.and_then(|n| i64::try_from(n).ok()).unwrap_or(-1);
    let examined = i64::try_from(step.examined).unwrap_or(i64::MAX);
    Reply::Array(vec![
        Reply::Int(next),
        Reply::Int(examined),
        Reply::Array(keys),
    ])
}
