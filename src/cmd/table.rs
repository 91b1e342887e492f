//! The command registry: every command's entry (name, arity, flags, key positions, `COMMAND`
//! metadata and parser), looked up by name, and written out for `COMMAND`.
//!
//! Each family file declares its own entries in a `COMMANDS` slice; `FAMILIES` puts the slices
//! in the order `COMMAND` lists them. An entry's index in `COMMANDS` is also what a client's
//! last command is remembered by (CLIENT LIST's `cmd=`).

use super::NodeCmd;
use super::{
    ParseError, Parsed, cell, cluster, concurrency, connection, expiry, hashes, keyspace, limits,
    lists, rules, scan, script, server, sets, strings, transactions, zsets,
};
use crate::protocol::{ArgError, Args, ReplyWriter};
use crate::rules::RuleSet;

/// Properties of a command the server acts on. `NO_AUTH`, `WRITE` and `READONLY` mirror the
/// Redis flags of the same names in `CommandSpec::flags` (they are derived from them);
/// `BARRIER` is bucketd's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flags(u8);

impl Flags {
    /// Runs before the connection has authenticated.
    pub const NO_AUTH: Flags = Flags(1);
    pub const WRITE: Flags = Flags(1 << 1);
    pub const READONLY: Flags = Flags(1 << 2);
    /// Must see every earlier reply of the round written before it runs: it changes how later
    /// replies are encoded or whether later commands may run (HELLO, AUTH, SELECT, QUIT,
    /// RESET), or it reads or clears every shard (DBSIZE, FLUSHALL, KEYS, SCAN).
    pub const BARRIER: Flags = Flags(1 << 3);

    pub const fn contains(self, f: Flags) -> bool {
        self.0 & f.0 == f.0
    }

    /// The typed flags named in a Redis flag list, plus `BARRIER` when `barrier` is set.
    pub(crate) const fn of_names(names: &[&str], barrier: bool) -> Flags {
        let mut bits = if barrier { Flags::BARRIER.0 } else { 0 };
        let mut i = 0;
        while i < names.len() {
            let n = names[i].as_bytes();
            if eq(n, b"no_auth") {
                bits |= Flags::NO_AUTH.0;
            } else if eq(n, b"write") {
                bits |= Flags::WRITE.0;
            } else if eq(n, b"readonly") {
                bits |= Flags::READONLY.0;
            }
            i += 1;
        }
        Flags(bits)
    }
}

const fn eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// How a command's arguments become work.
#[derive(Clone, Copy)]
pub enum Parser {
    /// A command on keys: it becomes a `KeyCmd` for one shard, or a `MultiCmd` over several.
    Key(fn(&mut Args, &RuleSet) -> Result<Parsed, ParseError>),
    /// A command the node runs itself. An error is kept, not returned at once: the command
    /// answers it when it runs (in a transaction, at EXEC).
    Node(fn(&mut Args) -> Result<NodeCmd, ArgError>),
}

#[derive(Clone, Copy)]
pub struct CommandSpec {
    /// Lowercase, as Redis reports it.
    pub name: &'static str,
    /// Positive: exact argument count including the name; negative: at least that many.
    pub arity: i64,
    /// As `COMMAND` reports them, in this order.
    pub flags: &'static [&'static str],
    /// What the server tests, derived from `flags` (and the entry's `barrier`).
    pub props: Flags,
    pub first_key: i64,
    pub last_key: i64,
    pub step: i64,
    pub acl: &'static [&'static str],
    pub group: &'static str,
    pub summary: &'static str,
    pub parse: Parser,
}

impl CommandSpec {
    pub const fn is_no_auth(&self) -> bool {
        self.props.contains(Flags::NO_AUTH)
    }

    pub const fn is_barrier(&self) -> bool {
        self.props.contains(Flags::BARRIER)
    }

    pub const fn is_readonly(&self) -> bool {
        self.props.contains(Flags::READONLY)
    }
}

/// One registry entry. `keys: (first, last, step)` as `COMMAND` reports them; `barrier: true`
/// marks a `Flags::BARRIER` command.
macro_rules! command {
    (
        name: $name:expr,
        arity: $arity:expr,
        flags: [$($flag:expr),* $(,)?],
        keys: ($first:expr, $last:expr, $step:expr),
        acl: [$($acl:expr),* $(,)?],
        group: $group:expr,
        summary: $summary:expr,
        $(barrier: $barrier:expr,)?
        parse: $parse:expr $(,)?
    ) => {
        $crate::cmd::table::CommandSpec {
            name: $name,
            arity: $arity,
            flags: &[$($flag),*],
            props: $crate::cmd::table::Flags::of_names(&[$($flag),*], false $(|| $barrier)?),
            first_key: $first,
            last_key: $last,
            step: $step,
            acl: &[$($acl),*],
            group: $group,
            summary: $summary,
            parse: $parse,
        }
    };
}
pub(super) use command;

/// Every family's entries, in the order `COMMAND` lists them.
const FAMILIES: &[&[CommandSpec]] = &[
    connection::COMMANDS,
    server::COMMANDS,
    strings::COMMANDS,
    hashes::COMMANDS,
    zsets::COMMANDS,
    lists::COMMANDS,
    sets::COMMANDS,
    expiry::COMMANDS,
    keyspace::COMMANDS,
    cell::COMMANDS,
    limits::COMMANDS,
    concurrency::COMMANDS,
    rules::COMMANDS,
    cluster::COMMANDS,
    transactions::COMMANDS,
    scan::COMMANDS,
    script::COMMANDS,
];

const COUNT: usize = {
    let mut n = 0;
    let mut i = 0;
    while i < FAMILIES.len() {
        n += FAMILIES[i].len();
        i += 1;
    }
    n
};

/// Every command, in `COMMAND`'s order.
pub(crate) static COMMANDS: &[CommandSpec] = &ALL;

static ALL: [CommandSpec; COUNT] = {
    let mut out = [FAMILIES[0][0]; COUNT];
    let (mut n, mut f) = (0, 0);
    while f < FAMILIES.len() {
        let mut i = 0;
        while i < FAMILIES[f].len() {
            out[n] = FAMILIES[f][i];
            n += 1;
            i += 1;
        }
        f += 1;
    }
    out
};

/// Subcommands of container commands that CLIENT LIST shows as `cmd=container|sub`, and
/// COMMAND LIST lists after the commands.
pub(crate) static SUBCOMMANDS: &[&str] = &[
    "client|id",
    "client|setname",
    "client|getname",
    "client|setinfo",
    "client|info",
    "client|list",
    "client|kill",
    "client|no-evict",
    "client|no-touch",
    "client|help",
    "config|get",
    "config|set",
    "config|resetstat",
    "config|help",
    "command|count",
    "command|list",
    "command|info",
    "command|docs",
    "command|getkeys",
    "command|help",
    "cluster|info",
    "cluster|nodes",
    "cluster|slots",
    "cluster|shards",
    "cluster|myid",
    "cluster|keyslot",
];

/// What a container command's subcommand is remembered by: its index in `SUBCOMMANDS` plus
/// one, or 0 when it is not one of them.
pub(crate) fn subcommand(container: &str, sub: &str) -> usize {
    SUBCOMMANDS
        .iter()
        .position(|full| {
            full.split_once('|')
                .is_some_and(|(cont, s)| cont == container && s.eq_ignore_ascii_case(sub))
        })
        .map_or(0, |i| i + 1)
}

/// Finds a command by its name, in any case.
pub(crate) fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    index_of(name).map(|i| &COMMANDS[i])
}

/// Longest command name (`client|no-evict`-style names are not looked up here).
const MAX_NAME: usize = 32;

/// Where a command's entry is in `COMMANDS`. Every request goes through here, so it is one
/// hash lookup of the lowercased name rather than a walk of the table.
pub(crate) fn index_of(name: &[u8]) -> Option<usize> {
    static INDEX: std::sync::OnceLock<ahash::AHashMap<&'static [u8], usize>> =
        std::sync::OnceLock::new();
    if name.len() > MAX_NAME {
        return None;
    }
    // A pipeline mostly repeats one command, spelled the same way each time: the last name
    // this thread found is compared first, byte for byte, before the lowercasing and the map.
    let mut spelled = [0u8; MAX_NAME];
    spelled[..name.len()].copy_from_slice(name);
    let last = LAST_FOUND.get();
    if last.len as usize == name.len() && last.name == spelled {
        return Some(last.index);
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
    let found = index.get(&lower[..]).copied();
    if let Some(index) = found {
        LAST_FOUND.set(LastFound {
            name: spelled,
            len: name.len() as u8,
            index,
        });
    }
    found
}

/// The last command name `index_of` found on this thread, as it was spelled.
#[derive(Clone, Copy)]
struct LastFound {
    name: [u8; MAX_NAME],
    len: u8,
    index: usize,
}

thread_local! {
    static LAST_FOUND: std::cell::Cell<LastFound> = const {
        std::cell::Cell::new(LastFound {
            name: [0; MAX_NAME],
            // No name is this long: nothing matches until a name has been found.
            len: u8::MAX,
            index: 0,
        })
    };
}

/// True if `argc` (including the command name) fits the spec's arity.
pub(crate) fn arity_ok(spec: &CommandSpec, argc: usize) -> bool {
    let argc = argc as i64;
    if spec.arity >= 0 {
        argc == spec.arity
    } else {
        argc >= -spec.arity
    }
}

/// Writes one 10-field `COMMAND` entry.
pub(crate) fn write_info(w: &mut ReplyWriter, c: &CommandSpec) {
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
        w.simple(if c.is_readonly() { "RO" } else { "RW" });
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
pub(crate) fn write_docs(w: &mut ReplyWriter, c: &CommandSpec) {
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

    /// The last name found is remembered: a repeat, a prefix of it, a name it is a prefix of,
    /// another case or an unknown name right after it are all answered as on their own.
    #[test]
    fn lookups_in_any_order_find_what_each_finds_alone() {
        let names: Vec<String> = COMMANDS
            .iter()
            .flat_map(|c| {
                let n = c.name.to_string();
                let mut v = vec![n.clone(), n.clone(), n.to_ascii_uppercase()];
                if n.len() > 1 {
                    v.push(n[..n.len() - 1].to_string());
                }
                v.push(format!("{n}x"));
                v
            })
            .chain(["".to_string(), "nosuchcommand".to_string()])
            .collect();
        let alone = |n: &str| COMMANDS.iter().position(|c| c.name.eq_ignore_ascii_case(n));
        for n in &names {
            assert_eq!(index_of(n.as_bytes()), alone(n), "{n}");
        }
        for n in names.iter().rev() {
            assert_eq!(index_of(n.as_bytes()), alone(n), "{n}");
        }
    }

    #[test]
    fn typed_flags_name_the_commands_the_server_treats_apart() {
        let with = |f: Flags| -> Vec<&str> {
            COMMANDS
                .iter()
                .filter(|c| c.props.contains(f))
                .map(|c| c.name)
                .collect()
        };
        assert_eq!(with(Flags::NO_AUTH), ["hello", "auth", "quit", "reset"]);
        assert_eq!(
            with(Flags::BARRIER),
            [
                "hello", "auth", "select", "quit", "reset", "dbsize", "flushall", "flushdb",
                "keys", "scan"
            ]
        );
        for c in COMMANDS.iter() {
            assert_eq!(c.props.contains(Flags::WRITE), c.flags.contains(&"write"));
            assert_eq!(
                c.props.contains(Flags::READONLY),
                c.flags.contains(&"readonly")
            );
            assert_eq!(c.is_no_auth(), c.flags.contains(&"no_auth"));
        }
    }
}
