//! Commands over the keys of several shards at once, on a standalone node: the stores they
//! run against (`Stores`), and how a command whose keys live in several of them runs there.
//!
//! A standalone node answers as a standalone Redis does, whatever its number of shards: a
//! script, a transaction or a multi-key command runs atomically and isolated over keys of any
//! shards. The connection that coordinates such a command has every shard it needs lend it
//! its store (the lending shards wait, doing nothing else, until the stores come back; see
//! docs/multi-shard.md), then runs the command here, against all of them, without yielding.
//!
//! Commands whose keys one shard owns never come here: they run on that shard as they always
//! did, and pay nothing for this.

use super::keyed::{ExecStats, KeyCmd, MAX_REPLY_BYTES, Reply, TOO_LARGE, execute};
use super::scan::{Cursor, ScanCmd, scan_reply};
use crate::slot::key_slot;
use crate::store::Store;

/// What a command answers when it needs a store that is not held. A script that meets it
/// before writing anything is run again with every shard held, so a client never sees it.
pub(crate) static ESCALATE: &str = "ERR this command needs the keys of other shards";

/// A script's error when it reaches keys of a shard not held after it has written (it cannot
/// be run again from the start): its keys were not all declared.
pub(crate) const NEEDS_NODE: &str = "ERR a script that has written may not then reach keys of another shard: declare every key it uses in KEYS";

/// True for the reply that asks for every shard (`ESCALATE`, by identity: a script cannot
/// make it up).
pub(crate) fn is_escalate(r: &Reply) -> bool {
    matches!(r, Reply::Error(std::borrow::Cow::Borrowed(m)) if std::ptr::eq(*m, ESCALATE))
}

/// The stores a command may reach while it runs, and which shard owns a key.
pub(crate) struct Stores<'a> {
    /// The stores held, by shard number.
    held: Vec<(usize, &'a mut Store)>,
    /// Which shard owns each hash slot; None: every key is in the first store held.
    map: Option<&'a [u16]>,
    /// Every shard of the node is held (KEYS and DBSIZE see the whole keyspace).
    every: bool,
    /// A cluster group's store: scripts reach only the keys they declare, as Redis Cluster
    /// requires, and nothing node-wide.
    declared_only: bool,
    /// A write has run (a script that wrote may not be run again from the start).
    pub(crate) wrote: bool,
}

/// Where a command's keys are.
pub(crate) enum Place {
    /// All in the held store at this index.
    One(usize),
    /// In several held stores.
    Several,
    /// Some in a store not held.
    Elsewhere,
}

impl<'a> Stores<'a> {
    /// A node with one store (a standalone node of one shard, `declared_only` false) or a
    /// cluster group's store (`declared_only` true).
    pub(crate) fn one(store: &'a mut Store, declared_only: bool) -> Stores<'a> {
        Stores {
            held: vec![(0, store)],
            map: None,
            every: !declared_only,
            declared_only,
            wrote: false,
        }
    }

    /// Several stores of a standalone node; `every` when they are all of its shards.
    pub(crate) fn held(held: Vec<(usize, &'a mut Store)>, map: &'a [u16], every: bool) -> Self {
        Stores {
            held,
            map: Some(map),
            every,
            declared_only: false,
            wrote: false,
        }
    }

    pub(crate) fn declared_only(&self) -> bool {
        self.declared_only
    }

    /// The index among the held stores of the one that owns `key`.
    fn index_of(&self, key: &[u8]) -> Option<usize> {
        let Some(map) = self.map else {
            return Some(0);
        };
        let shard = usize::from(*map.get(usize::from(key_slot(key)) % map.len().max(1))?);
        self.held.iter().position(|(s, _)| *s == shard)
    }

    /// Where `keys` are.
    pub(crate) fn place<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) -> Place {
        let mut at = None;
        let mut several = false;
        for k in keys {
            match (self.index_of(k), at) {
                (None, _) => return Place::Elsewhere,
                (Some(i), None) => at = Some(i),
                (Some(i), Some(j)) if i != j => several = true,
                _ => {}
            }
        }
        match at {
            _ if several => Place::Several,
            Some(i) => Place::One(i),
            None => Place::One(0),
        }
    }

    fn store(&mut self, i: usize) -> Option<&mut Store> {
        self.held.get_mut(i).map(|(_, s)| &mut **s)
    }

    /// The two held stores at `a` and `b` (distinct), mutably.
    fn two(&mut self, a: usize, b: usize) -> Option<(&mut Store, &mut Store)> {
        if a == b || a >= self.held.len() || b >= self.held.len() {
            return None;
        }
        let (lo, hi) = (a.min(b), a.max(b));
        let (left, right) = self.held.split_at_mut(hi);
        let (x, y) = (&mut *left[lo].1, &mut *right[0].1);
        Some(if a < b { (x, y) } else { (y, x) })
    }

    /// Runs `cmd` at `now` on the stores its keys are in. A command that needs a store not
    /// held answers `ESCALATE`.
    pub(crate) fn run(&mut self, cmd: &KeyCmd, now: u64, st: &mut ExecStats) -> Reply {
        match cmd {
            KeyCmd::Keys(_) | KeyCmd::DbSize | KeyCmd::FlushAll => {
                if !self.every {
                    return Reply::err(ESCALATE);
                }
                let mut parts = Vec::with_capacity(self.held.len());
                for (_, s) in &mut self.held {
                    parts.push(execute(s, cmd, now, st));
                }
                merge_node_wide(cmd, parts)
            }
            KeyCmd::Eval(_) => Reply::err("ERR This Redis command is not allowed from script"),
            _ => {
                let keys = keys_of(cmd);
                match self.place(keys.iter().copied()) {
                    Place::One(i) => match self.store(i) {
                        Some(s) => execute(s, cmd, now, st),
                        None => Reply::err(ESCALATE),
                    },
                    Place::Elsewhere => Reply::err(ESCALATE),
                    Place::Several => self.run_split(cmd, now, st),
                }
            }
        }
    }

    /// SCAN from a script: over every shard, with the cursor a client's SCAN has.
    pub(crate) fn scan(&mut self, scan: &ScanCmd, now: u64, st: &mut ExecStats) -> Reply {
        if !self.every {
            return Reply::err(ESCALATE);
        }
        let n = self.held.iter().map(|(s, _)| s + 1).max().unwrap_or(0);
        let mut at = Cursor::of(scan.cursor);
        let (mut examined, mut keys) = (0u64, Vec::new());
        while at.shard < n && examined < scan.count {
            let Some((_, store)) = self.held.iter_mut().find(|(s, _)| *s == at.shard) else {
                at = Cursor {
                    shard: at.shard + 1,
                    from: 0,
                };
                continue;
            };
            let reply = execute(store, &at.step_cmd(scan, examined), now, st);
            match at.advance(reply, &mut keys) {
                Ok(seen) => examined += seen,
                Err(e) => return Reply::err(e),
            }
        }
        scan_reply(at.wire(n), keys)
    }

    /// A command whose keys are in several held stores.
    fn run_split(&mut self, cmd: &KeyCmd, now: u64, st: &mut ExecStats) -> Reply {
        match cmd {
            KeyCmd::Del(keys) | KeyCmd::Exists(keys) => {
                let mut n = 0i64;
                for k in keys {
                    let one = match cmd {
                        KeyCmd::Del(_) => KeyCmd::Del(vec![k.clone()]),
                        _ => KeyCmd::Exists(vec![k.clone()]),
                    };
                    n += self.run(&one, now, st).as_int().unwrap_or(0);
                }
                Reply::Int(n)
            }
            KeyCmd::MGet(keys) => {
                let (mut out, mut total) = (Vec::with_capacity(keys.len()), 0usize);
                for k in keys {
                    match self.run(&KeyCmd::MGet(vec![k.clone()]), now, st) {
                        Reply::Array(mut v) if v.len() == 1 => {
                            if let Some(Reply::Bulk(b)) = v.last() {
                                total += b.len();
                            }
                            out.extend(v.pop());
                        }
                        other => return other,
                    }
                }
                if total > MAX_REPLY_BYTES {
                    return Reply::err(TOO_LARGE);
                }
                Reply::Array(out)
            }
            KeyCmd::MSet { keys, values } => {
                // Each store's share at once (atomic there); every share is set before
                // anyone can look, since the stores are held.
                let mut shares: Vec<(usize, Vec<bytes::Bytes>, Vec<bytes::Bytes>)> = Vec::new();
                for (k, v) in keys.iter().zip(values) {
                    let Some(i) = self.index_of(k) else {
                        return Reply::err(ESCALATE);
                    };
                    match shares.iter_mut().find(|s| s.0 == i) {
                        Some(s) => {
                            s.1.push(k.clone());
                            s.2.push(v.clone());
                        }
                        None => shares.push((i, vec![k.clone()], vec![v.clone()])),
                    }
                }
                let mut reply = Reply::Ok;
                for (i, keys, values) in shares {
                    if let Some(s) = self.store(i) {
                        let r = execute(s, &KeyCmd::MSet { keys, values }, now, st);
                        if matches!(r, Reply::Error(_)) {
                            reply = r;
                        }
                    }
                }
                reply
            }
            KeyCmd::Rename { from, to, nx } => {
                let (Some(a), Some(b)) = (self.index_of(from), self.index_of(to)) else {
                    return Reply::err(ESCALATE);
                };
                match self.two(a, b) {
                    Some((src, dst)) => super::keyspace::rename(src, Some(dst), from, to, *nx, now),
                    None => Reply::err(ESCALATE),
                }
            }
            KeyCmd::Copy { from, to, replace } => {
                let (Some(a), Some(b)) = (self.index_of(from), self.index_of(to)) else {
                    return Reply::err(ESCALATE);
                };
                match self.two(a, b) {
                    Some((src, dst)) => {
                        super::keyspace::copy(src, Some(dst), from, to, *replace, now)
                    }
                    None => Reply::err(ESCALATE),
                }
            }
            // Every other command has one key.
            _ => Reply::err(ESCALATE),
        }
    }
}

/// The keys a command works on (none for the node-wide ones).
pub(crate) fn keys_of(cmd: &KeyCmd) -> Vec<&[u8]> {
    match cmd {
        KeyCmd::Del(keys) | KeyCmd::Exists(keys) | KeyCmd::MGet(keys) => {
            keys.iter().map(|k| &k[..]).collect()
        }
        KeyCmd::MSet { keys, .. }
        | KeyCmd::CheckAll { keys, .. }
        | KeyCmd::Refund { keys, .. }
        | KeyCmd::CheckSet { keys, .. }
        | KeyCmd::RefundSet { keys, .. } => keys.iter().map(|k| &k[..]).collect(),
        KeyCmd::Rename { from, to, .. } | KeyCmd::Copy { from, to, .. } => vec![from, to],
        other => vec![other.route_key()],
    }
}

/// One reply for a node-wide command from each store's.
fn merge_node_wide(cmd: &KeyCmd, parts: Vec<Reply>) -> Reply {
    match cmd {
        KeyCmd::Keys(_) => {
            let mut all = Vec::new();
            for p in parts {
                if let Reply::Array(v) = p {
                    all.extend(v);
                }
            }
            Reply::Array(all)
        }
        KeyCmd::DbSize => Reply::Int(parts.iter().filter_map(Reply::as_int).sum()),
        _ => Reply::Ok,
    }
}
