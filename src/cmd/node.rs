//! Runs node commands: the commands the node answers itself (connection state, server
//! information, operations over every shard). `run` hands each parsed family to the `run` of
//! its file under `src/cmd/`, which acts on the connection through `Conn`'s accessors, and
//! turns a refusal into its error reply.

use super::table::CommandSpec;
use super::{NodeCmd, cluster, connection, rules, scan, script, server};
use crate::protocol::{ArgError, ReplyWriter};
use crate::server::conn::Conn;
use crate::shard::ShardGone;
use std::sync::atomic::Ordering;

/// Runs a parsed node command, or answers why its arguments were refused.
pub(crate) async fn run(
    c: &mut Conn,
    spec: &'static CommandSpec,
    cmd: Result<NodeCmd, ArgError>,
    buf: &mut Vec<u8>,
) -> Result<(), ShardGone> {
    let res = match cmd {
        Ok(cmd) => dispatch(c, spec, cmd, buf).await,
        Err(e) => Err(Failure::Arg(e)),
    };
    match res {
        Ok(()) => Ok(()),
        Err(Failure::Arg(e)) => {
            ReplyWriter::new(buf, c.resp3()).error(&e.to_string());
            Ok(())
        }
        Err(Failure::Gone(g)) => Err(g),
    }
}

/// Why a node command stopped: its reply is this error, or a shard is gone.
pub(crate) enum Failure {
    Arg(ArgError),
    Gone(ShardGone),
}

impl From<ArgError> for Failure {
    fn from(e: ArgError) -> Self {
        Failure::Arg(e)
    }
}

impl From<ShardGone> for Failure {
    fn from(e: ShardGone) -> Self {
        Failure::Gone(e)
    }
}

/// An error reply, as given.
pub(crate) fn msg(m: impl Into<String>) -> Failure {
    Failure::Arg(ArgError::Msg(m.into()))
}

async fn dispatch(
    c: &mut Conn,
    spec: &'static CommandSpec,
    cmd: NodeCmd,
    buf: &mut Vec<u8>,
) -> Result<(), Failure> {
    match cmd {
        NodeCmd::Connection(cmd) => connection::run(c, cmd, buf)?,
        NodeCmd::Server(cmd) => server::run(c, cmd, buf).await?,
        NodeCmd::Scan(cmd) => scan::run(c, cmd, buf).await?,
        NodeCmd::Rule(cmd) => rules::run(c, cmd, buf).await?,
        NodeCmd::Cluster(cmd) => cluster::run(c, cmd, buf).await?,
        NodeCmd::Script(cmd) => script::run(c, cmd, buf).await?,
        NodeCmd::Transaction(_) => {
            return Err(msg(format!(
                "ERR command '{}' is not available here",
                spec.name
            )));
        }
    }
    Ok(())
}

/// Records the subcommand a container command ran, for CLIENT LIST's `cmd=`.
pub(crate) fn note_subcommand(c: &Conn, sub: usize) {
    c.info().last_sub.store(sub, Ordering::Relaxed);
}

/// A HELP reply: one status line each, as Redis sends them.
pub(crate) fn write_help(w: &mut ReplyWriter, lines: &[&str]) {
    w.array(lines.len());
    for l in lines {
        w.simple(l);
    }
}
