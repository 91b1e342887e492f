//! What the Redis Tcl tests read of run.sh's output, shared by tests/redis_tcl.rs and
//! tests/redis_tcl_types.rs.

/// `(passed, failed)` from run.sh's closing line, "N passed, N failed[, N skipped]".
pub fn closing_counts(stdout: &str) -> Option<(u64, u64)> {
    let line = stdout.lines().rev().find(|l| !l.trim().is_empty())?;
    let mut parts = line.split(", ");
    let passed = parts.next()?.strip_suffix(" passed")?.parse().ok()?;
    let failed = parts.next()?.strip_suffix(" failed")?.parse().ok()?;
    Some((passed, failed))
}
