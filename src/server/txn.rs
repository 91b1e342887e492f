//! A transaction being queued, between MULTI and EXEC: its commands, what they weigh, and
//! whether EXEC may still run them. Every key command of a transaction shares one slot, so
//! EXEC runs them as one batch on the shard (or one entry of the group) that owns it.

use super::named::Named;
use crate::cmd::KeyCmd;
use crate::cmd::{CommandSpec, MultiCmd, NodeCmd};
use crate::protocol::ArgError;
use crate::slot::key_slot;

pub(super) const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";
const TOO_LARGE: &str = "ERR transaction larger than client-query-buffer-limit";

/// A transaction being queued (between MULTI and EXEC).
#[derive(Default)]
pub(super) struct Txn {
    items: Vec<TxnItem>,
    /// Wire bytes of the queued requests, held until EXEC.
    bytes: usize,
    /// A queued command was refused: EXEC aborts.
    pub(super) dirty: bool,
    /// The slot every keyed command must share (in a cluster).
    slot: Option<u16>,
    /// On a standalone node keys may be anywhere: EXEC runs over every shard they are on.
    standalone: bool,
}

enum TxnItem {
    /// A key command, and the rules it named (for shadow mode and the metrics by rule).
    Key(KeyCmd, Option<Vec<Named>>),
    Node(&'static CommandSpec, Result<NodeCmd, ArgError>),
}

/// A queued command as EXEC answers it, in order: the next reply of the key commands' batch
/// (with the rules the command named), or a node command to run then.
pub(super) type ExecItem =
    Result<Option<Vec<Named>>, (&'static CommandSpec, Result<NodeCmd, ArgError>)>;

/// The slot all of `keys` hash to, if they share one (None for no keys).
pub(super) fn common_slot<'a>(mut keys: impl Iterator<Item = &'a [u8]>) -> Option<u16> {
    let slot = key_slot(keys.next()?);
    keys.all(|k| key_slot(k) == slot).then_some(slot)
}

impl Txn {
    pub(super) fn new(standalone: bool) -> Txn {
        Txn {
            standalone,
            ..Txn::default()
        }
    }

    /// Queues a key command; refused (and the transaction doomed) when its slot is not the
    /// transaction's, or the transaction would pass `limit` bytes.
    pub(super) fn queue_key(
        &mut self,
        cmd: KeyCmd,
        named: Option<Vec<Named>>,
        wire_len: usize,
        limit: usize,
    ) -> Result<(), &'static str> {
        self.use_slot(Some(key_slot(cmd.route_key())))?;
        self.push(TxnItem::Key(cmd, named), wire_len, limit)
    }

    /// Queues a multi-key command, whose keys must share the transaction's slot.
    pub(super) fn queue_multi(
        &mut self,
        m: MultiCmd,
        named: Option<Vec<Named>>,
        wire_len: usize,
        limit: usize,
    ) -> Result<(), &'static str> {
        let slot = match self.standalone {
            true => m.keys().first().map(|k| crate::slot::key_slot(k)),
            false => common_slot(m.keys().iter().map(|k| &k[..])),
        };
        self.use_slot(slot)?;
        self.push(TxnItem::Key(m.into_key_cmd(), named), wire_len, limit)
    }

    /// Queues a node command, run when EXEC answers.
    pub(super) fn queue_node(
        &mut self,
        spec: &'static CommandSpec,
        args: Result<NodeCmd, ArgError>,
        wire_len: usize,
        limit: usize,
    ) -> Result<(), &'static str> {
        self.push(TxnItem::Node(spec, args), wire_len, limit)
    }

    /// Whether a command in `slot` (None: keys in several slots) may join: the first key
    /// command fixes the transaction's slot.
    fn use_slot(&mut self, slot: Option<u16>) -> Result<(), &'static str> {
        if self.standalone {
            if self.slot.is_none() {
                self.slot = slot;
            }
            return Ok(());
        }
        match slot {
            Some(slot) if *self.slot.get_or_insert(slot) == slot => Ok(()),
            _ => {
                self.dirty = true;
                Err(CROSSSLOT)
            }
        }
    }

    fn push(&mut self, item: TxnItem, wire_len: usize, limit: usize) -> Result<(), &'static str> {
        if self.bytes + wire_len > limit {
            self.dirty = true;
            return Err(TOO_LARGE);
        }
        self.bytes += wire_len;
        self.items.push(item);
        Ok(())
    }

    /// The slot of the key commands, their batch, and every queued command in order as EXEC
    /// answers it.
    pub(super) fn into_parts(self) -> (u16, Vec<KeyCmd>, Vec<ExecItem>) {
        let mut keyed = Vec::new();
        let mut order = Vec::with_capacity(self.items.len());
        for item in self.items {
            match item {
                TxnItem::Key(cmd, named) => {
                    keyed.push(cmd);
                    order.push(Ok(named));
                }
                TxnItem::Node(spec, args) => order.push(Err((spec, args))),
            }
        }
        (self.slot.unwrap_or(0), keyed, order)
    }
}
