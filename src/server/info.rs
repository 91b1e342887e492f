//! The INFO text: Redis's sections, plus bucketd's own.

use super::{Node, REDIS_COMPAT_VERSION, VERSION};
use std::fmt::Write;
use std::sync::atomic::Ordering;

/// Resident set size of this process, in bytes (0 where /proc is not available).
pub(crate) fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

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
    let sum = |f: &dyn Fn(&crate::shard::ShardStats) -> u64| -> u64 {
        node.shards.iter().map(|s| f(&s.stats)).sum()
    };
    let keys = sum(&|s| s.keys.load(Ordering::Relaxed));
    let used = sum(&|s| s.bytes.load(Ordering::Relaxed));
    let rss = rss_bytes();
    if wanted(sections, "server") {
        let _ = write!(
            out,
            "# Server\r\nredis_version:{REDIS_COMPAT_VERSION}\r\nbucketd_version:{VERSION}\r\nredis_mode:{}\r\nos:{}\r\narch_bits:64\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\nexecutable:bucketd\r\n\r\n",
            if node.cluster().is_some() {
                "cluster"
            } else {
                "standalone"
            },
            std::env::consts::OS,
            std::process::id(),
            node.addr.port(),
            node.started.elapsed().as_secs()
        );
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
            "# Memory\r\nused_memory:{used}\r\nused_memory_rss:{rss}\r\nmaxmemory:{}\r\nmaxmemory_policy:noeviction\r\n\r\n",
            node.live.caps.max_bytes()
        );
    }
    // Error replies by code, summed over the shards that sent them.
    let mut errors: Vec<(&str, u64)> = Vec::new();
    for s in &node.shards {
        for (i, (code, n)) in s.stats.errors.snapshot().enumerate() {
            match errors.get_mut(i) {
                Some(e) => e.1 += n,
                None => errors.push((code, n)),
            }
        }
    }
    let total_errors: u64 = errors.iter().map(|e| e.1).sum();
    if wanted(sections, "stats") {
        let st = &node.stats;
        let _ = write!(
            out,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\ninstantaneous_ops_per_sec:{}\r\nrejected_connections:{}\r\nexpired_keys:{}\r\nunexpected_error_replies:0\r\ntotal_error_replies:{total_errors}\r\nprotocol_errors:{}\r\n\r\n",
            st.connections_received.load(Ordering::Relaxed),
            sum(&|s| s.requests.load(Ordering::Relaxed)),
            st.commands_per_sec.load(Ordering::Relaxed),
            st.rejected_connections.load(Ordering::Relaxed),
            sum(&|s| s.expired.load(Ordering::Relaxed)),
            st.protocol_errors.load(Ordering::Relaxed),
        );
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
        for (code, n) in errors.iter().filter(|e| e.1 > 0) {
            let _ = write!(out, "errorstat_{code}:count={n}\r\n");
        }
        out.push_str("\r\n");
    }
    if wanted(sections, "cluster") {
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
    if wanted(sections, "keyspace") {
        out.push_str("# Keyspace\r\n");
        if keys > 0 {
            let expires = sum(&|s| s.expires.load(Ordering::Relaxed));
            // Each shard's sampled average, weighted by how many keys with a TTL it holds.
            let weighted: u128 = node
                .shards
                .iter()
                .map(|s| {
                    u128::from(s.stats.avg_ttl_ms.load(Ordering::Relaxed))
                        * u128::from(s.stats.expires.load(Ordering::Relaxed))
                })
                .sum();
            let avg_ttl = weighted.checked_div(u128::from(expires)).unwrap_or(0);
            let _ = write!(
                out,
                "db0:keys={keys},expires={expires},avg_ttl={avg_ttl}\r\n"
            );
        }
        out.push_str("\r\n");
    }
    if wanted(sections, "bucketd") {
        let checks = sum(&|s| s.checks.load(Ordering::Relaxed));
        let denied = sum(&|s| s.denied.load(Ordering::Relaxed));
        let _ = write!(
            out,
            "# Bucketd\r\nshards:{}\r\nchecks_total:{checks}\r\nchecks_denied:{denied}\r\nchecks_per_sec:{}\r\nkeys_rejected_full:{}\r\nrules:{}\r\nbytes_per_key:{}\r\n",
            node.shards.len(),
            node.stats.checks_per_sec.load(Ordering::Relaxed),
            sum(&|s| s.rejected_full.load(Ordering::Relaxed)),
            node.rules.load().len(),
            used.checked_div(keys).unwrap_or(0),
        );
        for s in &node.shards {
            let _ = write!(
                out,
                "shard{}:keys={},bytes={},commands={},checks={},batches_from_other_shards={}\r\n",
                s.id,
                s.stats.keys.load(Ordering::Relaxed),
                s.stats.bytes.load(Ordering::Relaxed),
                s.stats.commands.load(Ordering::Relaxed),
                s.stats.checks.load(Ordering::Relaxed),
                s.stats.remote_batches.load(Ordering::Relaxed)
            );
        }
        out.push_str("\r\n");
    }
    while out.ends_with("\r\n\r\n") {
        out.truncate(out.len() - 2);
    }
    out
}
