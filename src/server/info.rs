//! The INFO text: Redis's sections, plus bucketd's own.

use super::report::{NodeReport, stats};
use super::{Node, REDIS_COMPAT_VERSION, VERSION};
use std::fmt::Write;
use std::sync::atomic::Ordering;

/// CPU seconds (system, user) used by this process (`RUSAGE_SELF`) or its waited-for
/// children (`RUSAGE_CHILDREN`).
fn cpu_seconds(who: libc::c_int) -> (f64, f64) {
    // SAFETY: getrusage only writes the struct it is given, which is a plain C struct for
    // which all-zero bytes are a valid value.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(who, &mut ru) != 0 {
            return (0.0, 0.0);
        }
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(ru.ru_stime), secs(ru.ru_utime))
}

fn wanted(sections: &[String], name: &str) -> bool {
    sections.is_empty()
        || sections.iter().any(|s| {
            s == name
                || s == "all"
                || s == "everything"
                || (s == "default" && name != "commandstats")
        })
}

/// Renders the requested sections (all when `sections` is empty).
pub(crate) fn render(node: &Node, sections: &[String]) -> String {
    let mut out = String::new();
    let st = stats(node);
    if wanted(sections, "server") {
        server(&mut out, node);
    }
    if wanted(sections, "clients") {
        let _ = write!(
            out,
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\n\r\n",
            node.connected_clients(),
            node.live.maxclients()
        );
    }
    if wanted(sections, "memory") {
        let _ = write!(
            out,
            "# Memory\r\nused_memory:{}\r\nused_memory_rss:{}\r\nmaxmemory:{}\r\nmaxmemory_policy:noeviction\r\n\r\n",
            st.used_bytes,
            st.rss_bytes,
            node.live.caps.max_bytes()
        );
    }
    if wanted(sections, "stats") {
        stats_section(&mut out, node, &st);
    }
    if wanted(sections, "cpu") {
        let (sys, user) = cpu_seconds(libc::RUSAGE_SELF);
        let (csys, cuser) = cpu_seconds(libc::RUSAGE_CHILDREN);
        let _ = write!(
            out,
            "# CPU\r\nused_cpu_sys:{sys:.6}\r\nused_cpu_user:{user:.6}\r\nused_cpu_sys_children:{csys:.6}\r\nused_cpu_user_children:{cuser:.6}\r\n\r\n"
        );
    }
    if wanted(sections, "errorstats") {
        out.push_str("# Errorstats\r\n");
        for (code, n) in st.errors.iter().filter(|e| e.1 > 0) {
            let _ = write!(out, "errorstat_{code}:count={n}\r\n");
        }
        out.push_str("\r\n");
    }
    if wanted(sections, "cluster") {
        cluster(&mut out, node);
    }
    if wanted(sections, "keyspace") {
        out.push_str("# Keyspace\r\n");
        if st.keys > 0 {
            let _ = write!(
                out,
                "db0:keys={},expires={},avg_ttl={}\r\n",
                st.keys, st.expires, st.avg_ttl_ms
            );
        }
        out.push_str("\r\n");
    }
    if wanted(sections, "bucketd") {
        bucketd(&mut out, node, &st);
    }
    while out.ends_with("\r\n\r\n") {
        out.truncate(out.len() - 2);
    }
    out
}

fn server(out: &mut String, node: &Node) {
    // Limit time, and how far it is from the wall clock (a wall-clock step not yet absorbed,
    // see docs/time.md), in ms: positive when limit time is ahead.
    let now = node.now();
    let wall = node.clock.now_ns();
    let offset_ms = (i128::from(now) - i128::from(wall)) / 1_000_000;
    let _ = write!(
        out,
        "# Server\r\nredis_version:{REDIS_COMPAT_VERSION}\r\nbucketd_version:{VERSION}\r\nredis_mode:{}\r\nos:{}\r\narch_bits:64\r\nprocess_id:{}\r\ntcp_port:{}\r\nserver_time_usec:{}\r\nclock_offset_ms:{offset_ms}\r\nuptime_in_seconds:{}\r\nexecutable:bucketd\r\n\r\n",
        if node.cluster().is_some() {
            "cluster"
        } else {
            "standalone"
        },
        std::env::consts::OS,
        std::process::id(),
        node.addr.port(),
        now / 1_000,
        node.started.elapsed().as_secs()
    );
}

fn stats_section(out: &mut String, node: &Node, st: &NodeReport) {
    let ns = &node.stats;
    let _ = write!(
        out,
        "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\ninstantaneous_ops_per_sec:{}\r\nrejected_connections:{}\r\nexpired_keys:{}\r\nunexpected_error_replies:0\r\ntotal_error_replies:{}\r\nprotocol_errors:{}\r\n\r\n",
        ns.connections_received.load(Ordering::Relaxed),
        st.requests,
        ns.commands_per_sec.load(Ordering::Relaxed),
        ns.rejected_connections.load(Ordering::Relaxed),
        st.expired,
        st.total_errors(),
        ns.protocol_errors.load(Ordering::Relaxed),
    );
}

fn cluster(out: &mut String, node: &Node) {
    let enabled = u8::from(node.cluster().is_some());
    let _ = write!(out, "# Cluster\r\ncluster_enabled:{enabled}\r\n");
    if let Some(c) = node.cluster() {
        // Groups led here that are idle and do not heartbeat, and groups followed here
        // whose quiet leader keeps this node's election timer off.
        let _ = write!(
            out,
            "cluster_quiet_groups:{}\r\ncluster_silenced_groups:{}\r\ncluster_quiet_wakes:{}\r\n",
            c.quiet_groups(),
            c.silenced_groups(),
            c.quiet_wakes()
        );
        // Frames refused because a peer's queue was full (the peer is not keeping up).
        let _ = write!(
            out,
            "cluster_peer_queue_full:{}\r\n",
            c.network().queue_full_drops()
        );
        // Log entries this node proposed for its own clients, and the commands they
        // carried: their ratio is how many checks one replication round carries.
        let (entries, commands) = c.proposals();
        let _ = write!(
            out,
            "cluster_entries_proposed:{entries}\r\ncluster_commands_proposed:{commands}\r\n"
        );
        // The Raft log's entries held in memory (their size on disk) and the bound.
        let (held, bound) = c.log_memory();
        let _ = write!(
            out,
            "cluster_log_memory_bytes:{held}\r\ncluster_log_memory_limit:{bound}\r\n"
        );
    }
    out.push_str("\r\n");
}

fn bucketd(out: &mut String, node: &Node, st: &NodeReport) {
    let _ = write!(
        out,
        "# Bucketd\r\nshards:{}\r\nchecks_total:{}\r\nchecks_denied:{}\r\nchecks_per_sec:{}\r\nkeys_rejected_full:{}\r\nrules:{}\r\nbytes_per_key:{}\r\n",
        node.shards.len(),
        st.checks,
        st.denied,
        node.stats.checks_per_sec.load(Ordering::Relaxed),
        st.rejected_full,
        node.rules.load().len(),
        st.used_bytes.checked_div(st.keys).unwrap_or(0),
    );
    for s in &st.shards {
        let _ = write!(
            out,
            "shard{}:keys={},bytes={},commands={},checks={},batches_from_other_shards={}\r\n",
            s.id, s.keys, s.bytes, s.commands, s.checks, s.remote_batches
        );
    }
    out.push_str("\r\n");
}
