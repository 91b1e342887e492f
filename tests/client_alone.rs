//! The client and the HTTP layer build without the server: a gateway that depends on bucketd
//! with `default-features = false, features = ["http"]` compiles neither openraft nor the node.

use std::process::Command;

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

#[test]
fn the_client_build_pulls_in_no_server_dependency() {
    let out = cargo()
        .args([
            "tree",
            "--no-default-features",
            "--features",
            "http",
            "--edges",
            "normal",
            "--prefix",
            "none",
            "--offline",
        ])
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        tree.contains("redis v"),
        "the client's own dependency is listed:\n{tree}"
    );
    for server_only in ["openraft", "crc32c", "crossbeam-channel", "clap", "toml v"] {
        assert!(
            !tree.lines().any(|l| l.starts_with(server_only)),
            "{server_only} is in the client-only build:\n{tree}"
        );
    }
}

#[test]
fn the_client_compiles_without_the_server() {
    // A target directory of its own, so this does not wait on the build lock of the test run.
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/client-alone");
    let out = cargo()
        .args([
            "check",
            "--lib",
            "--no-default-features",
            "--features",
            "http",
            "--offline",
            "--quiet",
        ])
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("cargo check runs");
    assert!(
        out.status.success(),
        "the client-only build does not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
