//! The `bucketd` binary: parses flags, starts a node, and stops it on SIGINT or SIGTERM.

use bucketd::clock::SystemClock;
use bucketd::config::{Flags, Settings};
use clap::Parser;
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    tune_allocator();
    let flags = Flags::parse();
    let settings = match Settings::resolve(&flags) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bucketd: {e}");
            return ExitCode::from(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&settings.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();

    // This runtime only accepts connections and runs housekeeping; clients are served on the
    // shard threads' own event loops.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .thread_name("bucketd-main")
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bucketd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let handle = match bucketd::server::start(settings, Arc::new(SystemClock)).await {
            Ok(h) => h,
            Err(e) => {
                tracing::error!("{e}");
                return ExitCode::FAILURE;
            }
        };
        wait_for_signal().await;
        tracing::info!("shutting down");
        handle.shutdown().await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}

/// Keeps glibc's malloc from handing memory back to the kernel after every burst. A shard
/// allocates and frees a turn's buffers (requests, replies, log entries) in bursts; by
/// default the heap's top was trimmed once it passed 128 KiB free, and the next burst faulted
/// the pages in again, zeroed: up to 18% of a cluster node's CPU under load went to that.
/// Memory the store no longer needs is still handed back, explicitly, when it shrinks (see
/// the shard's sweep). Fixing the trim threshold also fixes the mmap threshold, which glibc
/// would otherwise raise as large blocks are freed; it stays at glibc's initial 128 KiB, so
/// large buffers (the store's partitions) keep their own mappings, which grow without copying
/// and leave no holes in the heap (a 1 MiB threshold cost 6 bytes of RSS per bucket).
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's settings; it is called before any other
    // thread exists.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TOP_PAD, 1 << 20);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
