//! The `bucketd` binary: parses flags, starts a node, and stops it on SIGINT or SIGTERM.

use bucketd::clock::SystemClock;
use bucketd::config::{Flags, Settings};
use clap::Parser;
use std::process::ExitCode;
use std::sync::Arc;

mod heap;

#[global_allocator]
static HEAP: heap::Heap = heap::Heap;

fn main() -> ExitCode {
    heap::tune_glibc();
    bucketd::server::set_free_memory_release(heap::purge_jemalloc);
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
        let handle = match bucketd::start(settings, Arc::new(SystemClock)).await {
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
