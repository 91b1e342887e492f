//! The INFO text: Redis's sections, plus bucketd's own.

use super::{Node, REDIS_COMPAT_VERSION, VERSION};
use std::fmt::Write;
use std::sync::atomic::Ordering;

/// Resident set size of this process, in bytes (0 where /proc is not available).
pub fn rss_bytes() -> u64 {
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
pub fn render(node: &Node, sections: &[String]) -> String {
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
            node.settings.maxclients
        );
    }
    if wanted(sections, "memory") {
        let _ = write!(
            out,
            "# Memory\r\nused_memory:{used}\r\nused_memory_rss:{rss}\r\nmaxmemory:{}\r\nmaxmemory_policy:noeviction\r\n\r\n",
            node.settings.maxmemory
        );
    }
    if wanted(sections, "stats") {
        let st = &node.stats;
        let _ = write!(
            out,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\ninstantaneous_ops_per_sec:{}\r\nrejected_connections:{}\r\nexpired_keys:{}\r\nprotocol_errors:{}\r\n\r\n",
            st.connections_received.load(Ordering::Relaxed),
            sum(&|s| s.requests.load(Ordering::Relaxed)),
            st.commands_per_sec.load(Ordering::Relaxed),
            st.rejected_connections.load(Ordering::Relaxed),
            sum(&|s| s.expired.load(Ordering::Relaxed)),
            st.protocol_errors.load(Ordering::Relaxed),
        );
    }
    if wanted(sections, "cluster") {
        let enabled = u8::from(node.cluster().is_some());
        let _ = write!(out, "# Cluster\r\ncluster_enabled:{enabled}\r\n\r\n");
    }
    if wanted(sections, "keyspace") {
        out.push_str("# Keyspace\r\n");
        if keys > 0 {
            let _ = write!(out, "db0:keys={keys},expires=0,avg_ttl=0\r\n");
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
