//! Runs node commands: the commands the node answers itself (connection state, server
//! information, the cluster's view, named rules, SCAN, the script cache). Their entries and
//! parsing are in `crate::cmd`, which hands over a `NodeCmd`; `run` gives each family to the
//! `run` of its file here, which acts through the connection's `Session`, and turns a refusal
//! into its error reply.

mod cluster;
mod connection;
mod rules;
mod scan;
mod script;
mod server;

use super::session::Session;
use crate::cmd::CommandSpec;
use crate::cmd::NodeCmd;
use crate::protocol::{ArgError, ReplyWriter};
use crate::shard::ShardGone;

/// Runs a parsed node command, or answers why its arguments were refused.
pub(super) async fn run(
    s: &mut Session,
    spec: &'static CommandSpec,
    cmd: Result<NodeCmd, ArgError>,
    buf: &mut Vec<u8>,
) -> Result<(), ShardGone> {
    let res = match cmd {
        Ok(cmd) => dispatch(s, spec, cmd, buf).await,
        Err(e) => Err(Failure::Arg(e)),
    };
    match res {
        Ok(()) => Ok(()),
        Err(Failure::Arg(e)) => {
            ReplyWriter::new(buf, s.resp3()).error(&e.to_string());
            Ok(())
        }
        Err(Failure::Gone(g)) => Err(g),
    }
}

/// Why a node command stopped: its reply is this error, or a shard is gone.
enum Failure {
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
fn fail(m: impl Into<String>) -> Failure {
    Failure::Arg(ArgError::Msg(m.into()))
}

async fn dispatch(
    s: &mut Session,
    spec: &'static CommandSpec,
    cmd: NodeCmd,
    buf: &mut Vec<u8>,
) -> Result<(), Failure> {
    match cmd {
        NodeCmd::Connection(cmd) => connection::run(s, cmd, buf)?,
        NodeCmd::Server(cmd) => server::run(s, cmd, buf).await?,
        NodeCmd::Scan(cmd) => scan::run(s, cmd, buf).await?,
        NodeCmd::Rule(cmd) => rules::run(s, cmd, buf).await?,
        NodeCmd::Cluster(cmd) => cluster::run(s, cmd, buf).await?,
        NodeCmd::Script(cmd) => script::run(s, cmd, buf).await?,
        NodeCmd::Transaction(_) => {
            return Err(fail(format!(
                "ERR command '{}' is not available here",
                spec.name
            )));
        }
    }
    Ok(())
}

/// A HELP reply: one status line each, as Redis sends them.
fn write_help(w: &mut ReplyWriter, lines: &[&str]) {
    w.array(lines.len());
    for l in lines {
        w.simple(l);
    }
}
