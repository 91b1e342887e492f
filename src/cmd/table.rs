//! What `COMMAND` reports: every command's arity, flags and key positions, so cluster-aware
//! clients can route bucketd's own commands, and arity is checked in one place.

use crate::protocol::ReplyWriter;

pub struct CommandSpec {
    /// Lowercase, as Redis reports it.
    pub name: &'static str,
    /// Positive: exact argument count including the name; negative: at least that many.
    pub arity: i64,
    pub flags: &'static [&'static str],
    pub first_key: i64,
    pub last_key: i64,
    pub step: i64,
    pub acl: &'static [&'static str],
    pub group: &'static str,
    pub summary: &'static str,
}

macro_rules! spec {
    ($name:expr, $arity:expr, [$($flag:expr),*], $first:expr, $last:expr, $step:expr, [$($acl:expr),*], $group:expr, $summary:expr) => {
        CommandSpec { name: $name, arity: $arity, flags: &[$($flag),*], first_key: $first, last_key: $last, step: $step, acl: &[$($acl),*], group: $group, summary: $summary }
    };
}

pub static COMMANDS: &[CommandSpec] = &[
    spec!(
        "ping",
        -1,
        ["fast", "stale"],
        0,
        0,
        0,
        ["@fast", "@connection"],
        "connection",
        "Returns the server's liveliness response."
    ),
    spec!(
        "echo",
        2,
        ["fast"],
        0,
        0,
        0,
        ["@fast", "@connection"],
        "connection",
        "Returns the given string."
    ),
    spec!(
        "hello",
        -1,
        [
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy"
        ],
        0,
        0,
        0,
        ["@fast", "@connection"],
        "connection",
        "Handshakes with the server: protocol version, authentication, client name."
    ),
    spec!(
        "auth",
        -2,
        [
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy"
        ],
        0,
        0,
        0,
        ["@fast", "@connection"],
        "connection",
        "Authenticates the connection."
    ),
    spec!(
        "select",
        2,
        ["loading", "stale", "fast"],
        0,
        0,
        0,
        ["@fast", "@connection"],
        "connection",
        "Changes the selected database (only 0 exists)."
    ),
    spec!(
        "client",
        -2,
        ["noscript", "loading", "stale"],
        0,
        0,
        0,
        ["@slow", "@connection"],
        "connection",
        "Client connection commands: ID, SETNAME, GETNAME, SETINFO, INFO, LIST."
    ),
    spec!(
        "quit",
        -1,
        [
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy"
        ],
        0,
        0,
        0,
        ["@fast", "@connection"],
        "connection",
        "Closes the connection."
    ),
    spec!(
        "reset",
        1,
        [
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy"
        ],
        0,
        0,
        0,
        ["@fast", "@connection"],
        "connection",
        "Resets the connection to its initial state."
    ),
    spec!(
        "command",
        -1,
        ["loading", "stale"],
        0,
        0,
        0,
        ["@slow", "@connection"],
        "server",
        "Returns details about commands: COUNT, INFO, DOCS, LIST."
    ),
    spec!(
        "info",
        -1,
        ["loading", "stale"],
        0,
        0,
        0,
        ["@slow", "@dangerous"],
        "server",
        "Returns information and statistics about the server."
    ),
    spec!(
        "config",
        -2,
        ["admin", "noscript", "loading", "stale"],
        0,
        0,
        0,
        ["@admin", "@slow", "@dangerous"],
        "server",
        "Reads settings: CONFIG GET; CONFIG RESETSTAT."
    ),
    spec!(
        "dbsize",
        1,
        ["readonly", "fast"],
        0,
        0,
        0,
        ["@keyspace", "@read", "@fast"],
        "server",
        "Returns the number of keys."
    ),
    spec!(
        "flushall",
        -1,
        ["write"],
        0,
        0,
        0,
        ["@keyspace", "@write", "@slow", "@dangerous"],
        "server",
        "Removes all keys."
    ),
    spec!(
        "flushdb",
        -1,
        ["write"],
        0,
        0,
        0,
        ["@keyspace", "@write", "@slow", "@dangerous"],
        "server",
        "Removes all keys."
    ),
    spec!(
        "time",
        1,
        ["loading", "stale", "fast"],
        0,
        0,
        0,
        ["@fast"],
        "server",
        "Returns the server time."
    ),
    spec!(
        "keys",
        2,
        ["readonly"],
        0,
        0,
        0,
        ["@keyspace", "@read", "@slow", "@dangerous"],
        "generic",
        "Returns all key names that match a pattern."
    ),
    spec!(
        "get",
        2,
        ["readonly", "fast"],
        1,
        1,
        1,
        ["@read", "@string", "@fast"],
        "string",
        "Returns the string value of a key."
    ),
    spec!(
        "set",
        -3,
        ["write", "denyoom"],
        1,
        1,
        1,
        ["@write", "@string", "@slow"],
        "string",
        "Sets the string value of a key: EX, PX, EXAT, PXAT, KEEPTTL, NX, XX, GET."
    ),
    spec!(
        "incr",
        2,
        ["write", "denyoom", "fast"],
        1,
        1,
        1,
        ["@write", "@string", "@fast"],
        "string",
        "Increments the integer value of a key by one."
    ),
    spec!(
        "incrby",
        3,
        ["write", "denyoom", "fast"],
        1,
        1,
        1,
        ["@write", "@string", "@fast"],
        "string",
        "Increments the integer value of a key by a number."
    ),
    spec!(
        "decr",
        2,
        ["write", "denyoom", "fast"],
        1,
        1,
        1,
        ["@write", "@string", "@fast"],
        "string",
        "Decrements the integer value of a key by one."
    ),
    spec!(
        "decrby",
        3,
        ["write", "denyoom", "fast"],
        1,
        1,
        1,
        ["@write", "@string", "@fast"],
        "string",
        "Decrements the integer value of a key by a number."
    ),
    spec!(
        "setex",
        4,
        ["write", "denyoom"],
        1,
        1,
        1,
        ["@write", "@string", "@slow"],
        "string",
        "Sets the string value and time to live in seconds of a key."
    ),
    spec!(
        "psetex",
        4,
        ["write", "denyoom"],
        1,
        1,
        1,
        ["@write", "@string", "@slow"],
        "string",
        "Sets the string value and time to live in milliseconds of a key."
    ),
    spec!(
        "setnx",
        3,
        ["write", "denyoom", "fast"],
        1,
        1,
        1,
        ["@write", "@string", "@fast"],
        "string",
        "Sets the string value of a key only if the key does not exist."
    ),
    spec!(
        "getset",
        3,
        ["write", "denyoom", "fast"],
        1,
        1,
        1,
        ["@write", "@string", "@fast"],
        "string",
        "Sets the string value of a key and returns its old value."
    ),
    spec!(
        "getex",
        -2,
        ["write", "fast"],
        1,
        1,
        1,
        ["@write", "@string", "@fast"],
        "string",
        "Returns the string value of a key and optionally sets its expiry: EX, PX, EXAT, PXAT, PERSIST."
    ),
    spec!(
        "getdel",
        2,
        ["write", "fast"],
        1,
        1,
        1,
        ["@write", "@string", "@fast"],
        "string",
        "Returns the string value of a key and deletes the key."
    ),
    spec!(
        "incrbyfloat",
        3,
        ["write", "denyoom", "fast"],
        1,
        1,
        1,
        ["@write", "@string", "@fast"],
        "string",
        "Increments the float value of a key by a number."
    ),
    spec!(
        "mget",
        -2,
        ["readonly", "fast"],
        1,
        -1,
        1,
        ["@read", "@string", "@fast"],
        "string",
        "Returns the string values of several keys."
    ),
    spec!(
        "mset",
        -3,
        ["write", "denyoom"],
        1,
        -1,
        2,
        ["@write", "@string", "@slow"],
        "string",
        "Sets several keys to their values."
    ),
    spec!(
        "expiretime",
        2,
        ["readonly", "fast"],
        1,
        1,
        1,
        ["@keyspace", "@read", "@fast"],
        "generic",
        "Returns a key's expiry as a unix time in seconds."
    ),
    spec!(
        "pexpiretime",
        2,
        ["readonly", "fast"],
        1,
        1,
        1,
        ["@keyspace", "@read", "@fast"],
        "generic",
        "Returns a key's expiry as a unix time in milliseconds."
    ),
    spec!(
        "expire",
        -3,
        ["write", "fast"],
        1,
        1,
        1,
        ["@keyspace", "@write", "@fast"],
        "generic",
        "Sets a key's time to live in seconds."
    ),
    spec!(
        "pexpire",
        -3,
        ["write", "fast"],
        1,
        1,
        1,
        ["@keyspace", "@write", "@fast"],
        "generic",
        "Sets a key's time to live in milliseconds."
    ),
    spec!(
        "expireat",
        -3,
        ["write", "fast"],
        1,
        1,
        1,
        ["@keyspace", "@write", "@fast"],
        "generic",
        "Sets a key's expiry as a unix time in seconds."
    ),
    spec!(
        "pexpireat",
        -3,
        ["write", "fast"],
        1,
        1,
        1,
        ["@keyspace", "@write", "@fast"],
        "generic",
        "Sets a key's expiry as a unix time in milliseconds."
    ),
    spec!(
        "persist",
        2,
        ["write", "fast"],
        1,
        1,
        1,
        ["@keyspace", "@write", "@fast"],
        "generic",
        "Removes a key's expiry."
    ),
    spec!(
        "ttl",
        2,
        ["readonly", "fast"],
        1,
        1,
        1,
        ["@keyspace", "@read", "@fast"],
        "generic",
        "Returns a key's time to live in seconds."
    ),
    spec!(
        "pttl",
        2,
        ["readonly", "fast"],
        1,
        1,
        1,
        ["@keyspace", "@read", "@fast"],
        "generic",
        "Returns a key's time to live in milliseconds."
    ),
    spec!(
        "type",
        2,
        ["readonly", "fast"],
        1,
        1,
        1,
        ["@keyspace", "@read", "@fast"],
        "generic",
        "Returns the type of value stored at a key."
    ),
    spec!(
        "del",
        -2,
        ["write"],
        1,
        -1,
        1,
        ["@keyspace", "@write", "@slow"],
        "generic",
        "Deletes keys."
    ),
    spec!(
        "unlink",
        -2,
        ["write", "fast"],
        1,
        -1,
        1,
        ["@keyspace", "@write", "@fast"],
        "generic",
        "Deletes keys."
    ),
    spec!(
        "exists",
        -2,
        ["readonly", "fast"],
        1,
        -1,
        1,
        ["@keyspace", "@read", "@fast"],
        "generic",
        "Counts how many of the given keys exist."
    ),
    spec!(
        "cl.throttle",
        // As redis-cell registers it: the module checks its argument count itself.
        -1,
        ["write", "denyoom", "fast"],
        1,
        1,
        1,
        ["@write", "@fast", "@ratelimit"],
        "ratelimit",
        "redis-cell's GCRA rate limit: CL.THROTTLE key max_burst count period [quantity]."
    ),
    spec!(
        "bk.check",
        -3,
        ["write", "denyoom", "fast"],
        1,
        1,
        1,
        ["@write", "@fast", "@ratelimit"],
        "ratelimit",
        "Checks and consumes one limit: BK.CHECK key spec [COST n] [PEEK]."
    ),
    spec!(
        "bk.checkall",
        -4,
        ["write", "denyoom", "fast", "movablekeys"],
        2,
        2,
        1,
        ["@write", "@fast", "@ratelimit"],
        "ratelimit",
        "Checks several limits, consuming all or none: BK.CHECKALL numkeys key... spec... [COST n] [PEEK]."
    ),
    spec!(
        "bk.lease",
        4,
        ["write", "denyoom", "fast"],
        1,
        1,
        1,
        ["@write", "@fast", "@ratelimit"],
        "ratelimit",
        "Takes up to n units at once: BK.LEASE key spec n."
    ),
    spec!(
        "bk.reset",
        -2,
        ["write"],
        1,
        -1,
        1,
        ["@write", "@ratelimit"],
        "ratelimit",
        "Forgets buckets, refilling them: BK.RESET key [key ...]."
    ),
    spec!(
        "bk.rule",
        -2,
        ["admin"],
        0,
        0,
        0,
        ["@admin", "@ratelimit"],
        "ratelimit",
        "Named rules: BK.RULE SET|GET|DEL|LIST|RELOAD."
    ),
    spec!(
        "cluster",
        -2,
        ["stale"],
        0,
        0,
        0,
        ["@slow"],
        "cluster",
        "Cluster commands; standalone nodes answer CLUSTER KEYSLOT."
    ),
    spec!(
        "asking",
        1,
        ["fast"],
        0,
        0,
        0,
        ["@fast", "@connection"],
        "cluster",
        "Lets the next command on this connection reach a slot being imported."
    ),
    spec!(
        "readonly",
        1,
        ["loading", "stale", "fast"],
        0,
        0,
        0,
        ["@keyspace", "@fast"],
        "cluster",
        "Enables reads from replicas on this connection."
    ),
    spec!(
        "readwrite",
        1,
        ["loading", "stale", "fast"],
        0,
        0,
        0,
        ["@keyspace", "@fast"],
        "cluster",
        "Disables reads from replicas on this connection."
    ),
    spec!(
        "multi",
        1,
        ["noscript", "loading", "stale", "fast", "allow_busy"],
        0,
        0,
        0,
        ["@fast", "@transaction"],
        "transactions",
        "Starts a transaction: later commands are queued until EXEC."
    ),
    spec!(
        "exec",
        1,
        ["noscript", "loading", "stale", "skip_slowlog"],
        0,
        0,
        0,
        ["@slow", "@transaction"],
        "transactions",
        "Runs the queued commands atomically on the shard that owns their slot."
    ),
    spec!(
        "discard",
        1,
        ["noscript", "loading", "stale", "fast", "allow_busy"],
        0,
        0,
        0,
        ["@fast", "@transaction"],
        "transactions",
        "Drops the queued commands."
    ),
    spec!(
        "watch",
        -2,
        ["noscript", "loading", "stale", "fast", "allow_busy"],
        1,
        -1,
        1,
        ["@fast", "@transaction"],
        "transactions",
        "Not supported: transactions on one slot are already atomic."
    ),
    spec!(
        "unwatch",
        1,
        ["noscript", "loading", "stale", "fast", "allow_busy"],
        0,
        0,
        0,
        ["@fast", "@transaction"],
        "transactions",
        "Forgets watched keys (none are ever watched)."
    ),
    spec!(
        "scan",
        -2,
        ["readonly"],
        0,
        0,
        0,
        ["@keyspace", "@read", "@slow"],
        "generic",
        "Iterates over the key names: SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]."
    ),
];

/// Finds a command by its name, in any case.
pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    index_of(name).map(|i| &COMMANDS[i])
}

/// Longest command name (`client|no-evict`-style names are not looked up here).
const MAX_NAME: usize = 32;

/// Where a command's entry is in `COMMANDS`. Every request goes through here, so it is one
/// hash lookup of the lowercased name rather than a walk of the table.
pub fn index_of(name: &[u8]) -> Option<usize> {
    static INDEX: std::sync::OnceLock<ahash::AHashMap<&'static [u8], usize>> =
        std::sync::OnceLock::new();
    if name.len() > MAX_NAME {
        return None;
    }
    let mut lower = [0u8; MAX_NAME];
    let lower = &mut lower[..name.len()];
    lower.copy_from_slice(name);
    lower.make_ascii_lowercase();
    let index = INDEX.get_or_init(|| {
        COMMANDS
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.as_bytes(), i))
            .collect()
    });
    index.get(&lower[..]).copied()
}

/// True if `argc` (including the command name) fits the spec's arity.
pub fn arity_ok(spec: &CommandSpec, argc: usize) -> bool {
    let argc = argc as i64;
    if spec.arity >= 0 {
        argc == spec.arity
    } else {
        argc >= -spec.arity
    }
}

/// Writes one 10-field `COMMAND` entry.
pub fn write_info(w: &mut ReplyWriter, c: &CommandSpec) {
    w.array(10);
    w.bulk(c.name.as_bytes());
    w.int(c.arity);
    w.set(c.flags.len());
    for f in c.flags {
        w.simple(f);
    }
    w.int(c.first_key);
    w.int(c.last_key);
    w.int(c.step);
    w.set(c.acl.len());
    for a in c.acl {
        w.simple(a);
    }
    w.array(0); // tips
    if c.first_key > 0 {
        // One key spec: keys start at first_key and run to last_key with step.
        w.array(1);
        w.map(3);
        w.bulk(b"flags");
        w.array(1);
        w.simple(if c.flags.contains(&"readonly") {
            "RO"
        } else {
            "RW"
        });
        w.bulk(b"begin_search");
        w.map(2);
        w.kv_str("type", "index");
        w.bulk(b"spec");
        w.map(1);
        w.kv_int("index", c.first_key);
        w.bulk(b"find_keys");
        w.map(2);
        w.kv_str("type", "range");
        w.bulk(b"spec");
        w.map(3);
        w.kv_int(
            "lastkey",
            if c.last_key < 0 {
                c.last_key
            } else {
                c.last_key - c.first_key
            },
        );
        w.kv_int("keystep", c.step);
        w.kv_int("limit", 0);
    } else {
        w.array(0);
    }
    w.array(0); // subcommands
}

/// Writes one `COMMAND DOCS` entry (name, then its doc map).
pub fn write_docs(w: &mut ReplyWriter, c: &CommandSpec) {
    w.bulk(c.name.as_bytes());
    w.map(3);
    w.kv_str("summary", c.summary);
    w.kv_str("since", "1.0.0");
    w.kv_str("group", c.group);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_is_found_by_its_name_in_any_case() {
        for (i, c) in COMMANDS.iter().enumerate() {
            assert!(
                c.name.len() <= MAX_NAME,
                "{} is longer than the lookup takes",
                c.name
            );
            assert_eq!(index_of(c.name.as_bytes()), Some(i));
            assert_eq!(index_of(c.name.to_ascii_uppercase().as_bytes()), Some(i));
            assert!(std::ptr::eq(lookup(c.name.as_bytes()).unwrap(), c));
        }
        assert_eq!(index_of(b"nosuchcommand"), None);
        assert_eq!(index_of(b""), None);
        assert_eq!(index_of(&[b'g'; 100]), None);
    }
}
