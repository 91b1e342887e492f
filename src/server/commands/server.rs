//! Server commands, run by the node: COMMAND, INFO, CONFIG, DBSIZE, FLUSHALL, FLUSHDB, TIME,
//! KEYS.

use super::{Failure, fail, write_help};
use crate::cmd::{
    COMMANDS as ALL_COMMANDS, CommandSpec, SUBCOMMANDS, lookup, write_docs, write_info,
};
use crate::cmd::{CommandCmd, CommandSub, ConfigCmd, ListFilter, ServerCmd};
use crate::cmd::{KeyCmd, Reply, encode};
use crate::protocol::ReplyWriter;
use crate::server::session::Session;
use crate::server::{info, live};
use std::sync::atomic::Ordering;

/// Runs a server command.
pub(super) async fn run(s: &mut Session, cmd: ServerCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    match cmd {
        ServerCmd::Command(cmd) => command(s, cmd, buf)?,
        ServerCmd::Info(sections) => {
            let text = info::render(s.node(), &sections);
            ReplyWriter::new(buf, s.resp3()).verbatim(&text);
        }
        ServerCmd::Config { sub, cmd } => {
            s.note_subcommand(sub);
            config(s, cmd?, buf).await?;
        }
        ServerCmd::DbSize => {
            let total: i64 = s
                .all_shards(|| KeyCmd::DbSize)
                .await?
                .iter()
                .filter_map(Reply::as_int)
                .sum();
            ReplyWriter::new(buf, s.resp3()).int(total);
        }
        ServerCmd::Flush => {
            if s.node().cluster().is_some() {
                // Keys are replicated state: clearing this node's copies behind Raft's back
                // would make the replicas disagree.
                return Err(fail(
                    "ERR FLUSHALL is not supported in cluster mode; remove keys with DEL or BK.RESET",
                ));
            }
            s.all_shards(|| KeyCmd::FlushAll).await?;
            ReplyWriter::new(buf, s.resp3()).ok();
        }
        ServerCmd::Time => {
            let now = s.node().now();
            let mut w = ReplyWriter::new(buf, s.resp3());
            w.array(2);
            w.bulk((now / 1_000_000_000).to_string().as_bytes());
            w.bulk(((now % 1_000_000_000) / 1000).to_string().as_bytes());
        }
        ServerCmd::Keys(pattern) => {
            let replies = s.all_shards(|| KeyCmd::Keys(pattern.clone())).await?;
            let mut all = Vec::new();
            for r in replies {
                if let Reply::Array(items) = r {
                    all.extend(items);
                }
            }
            encode(&mut ReplyWriter::new(buf, s.resp3()), &Reply::Array(all));
        }
    }
    Ok(())
}

fn command(s: &mut Session, cmd: CommandCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    let cmd = match cmd {
        CommandCmd::All => {
            let mut w = ReplyWriter::new(buf, s.resp3());
            w.array(ALL_COMMANDS.len());
            for cmd in ALL_COMMANDS {
                write_info(&mut w, cmd);
            }
            return Ok(());
        }
        CommandCmd::Sub { sub, cmd } => {
            s.note_subcommand(sub);
            cmd?
        }
    };
    let mut w = ReplyWriter::new(buf, s.resp3());
    match cmd {
        CommandSub::Count => w.int(ALL_COMMANDS.len() as i64),
        CommandSub::List(filter) => {
            let listed: Vec<&CommandSpec> = ALL_COMMANDS
                .iter()
                .filter(|cmd| match &filter {
                    None => true,
                    // bucketd loads no modules.
                    Some(ListFilter::Module) => false,
                    Some(ListFilter::AclCat(cat)) => cmd.acl.iter().any(|c| {
                        c.strip_prefix('@')
                            .is_some_and(|c| c.as_bytes().eq_ignore_ascii_case(cat))
                    }),
                    Some(ListFilter::Pattern(pattern)) => {
                        crate::glob::matches_nocase(pattern, cmd.name.as_bytes())
                    }
                })
                .collect();
            // Subcommands are listed as `container|sub`, as Redis lists them; they have no
            // ACL categories or module of their own here.
            let subs: Vec<&str> = SUBCOMMANDS
                .iter()
                .copied()
                .filter(|full| match &filter {
                    None => true,
                    Some(ListFilter::Pattern(pattern)) => {
                        crate::glob::matches_nocase(pattern, full.as_bytes())
                    }
                    Some(_) => false,
                })
                .collect();
            w.array(listed.len() + subs.len());
            for cmd in listed {
                w.bulk(cmd.name.as_bytes());
            }
            for full in subs {
                w.bulk(full.as_bytes());
            }
        }
        CommandSub::Info(names) => {
            if names.is_empty() {
                w.array(ALL_COMMANDS.len());
                for cmd in ALL_COMMANDS {
                    write_info(&mut w, cmd);
                }
            } else {
                w.array(names.len());
                for n in names {
                    match lookup(&n) {
                        Some(cmd) => write_info(&mut w, cmd),
                        None => w.null_array(),
                    }
                }
            }
        }
        CommandSub::Docs(names) => {
            let found: Vec<&CommandSpec> = if names.is_empty() {
                ALL_COMMANDS.iter().collect()
            } else {
                names.iter().filter_map(|n| lookup(n)).collect()
            };
            w.map(found.len());
            for cmd in found {
                write_docs(&mut w, cmd);
            }
        }
        CommandSub::GetKeys(keys) => {
            w.array(keys.len());
            for k in keys {
                w.bulk(&k);
            }
        }
        CommandSub::Help => {
            let lines = [
                "COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "(no subcommand)",
                "    Return details about all commands.",
                "COUNT",
                "    Return the total number of commands in this server.",
                "LIST",
                "    Return a list of all commands in this server.",
                "INFO [<command-name> ...]",
                "    Return details about multiple commands.",
                "    If no command names are given, documentation details for all",
                "    commands are returned.",
                "DOCS [<command-name> ...]",
                "    Return documentation details about multiple commands.",
                "    If no command names are given, documentation details for all",
                "    commands are returned.",
                "GETKEYS <full-command>",
                "    Return the keys from a full command.",
                "LIST [FILTERBY (MODULE <module-name>|ACLCAT <category>|PATTERN <pattern>)]",
                "    Return a list of all commands in this server, filtered by module, ACL",
                "    category or a glob-style pattern.",
                "HELP",
                "    Print this help.",
            ];
            write_help(&mut w, &lines);
        }
    }
    Ok(())
}

async fn config(s: &mut Session, cmd: ConfigCmd, buf: &mut Vec<u8>) -> Result<(), Failure> {
    match cmd {
        ConfigCmd::Get(patterns) => {
            let hits = live::config_get(s.node(), &patterns);
            let mut w = ReplyWriter::new(buf, s.resp3());
            w.map(hits.len());
            for (k, v) in hits {
                w.kv_str(&k, &v);
            }
        }
        ConfigCmd::Set(pairs) => {
            let applied = live::config_set(s.node(), &pairs).map_err(fail)?;
            if applied.caps_switched {
                s.sync_caps().await?;
            }
            ReplyWriter::new(buf, s.resp3()).ok();
        }
        ConfigCmd::ResetStat => {
            for s in &s.node().shards {
                s.stats.errors.reset();
            }
            let st = &s.node().stats;
            st.connections_received.store(0, Ordering::Relaxed);
            st.rejected_connections.store(0, Ordering::Relaxed);
            st.protocol_errors.store(0, Ordering::Relaxed);
            ReplyWriter::new(buf, s.resp3()).ok();
        }
        ConfigCmd::Help => {
            let lines = [
                "CONFIG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "GET <pattern>",
                "    Return parameters matching the glob-like <pattern> and their values.",
                "SET <directive> <value>",
                "    Set the configuration <directive> to <value>.",
                "RESETSTAT",
                "    Reset statistics reported by the INFO command.",
                "HELP",
                "    Prints this help.",
            ];
            write_help(&mut ReplyWriter::new(buf, s.resp3()), &lines);
        }
    }
    Ok(())
}
