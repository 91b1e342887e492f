//! The programs some tests run beside bucketd (a real Redis, redis-cli, promtool, Tcl, Python
//! with redis-py or gRPC), and the one way a test asks for them: when one is missing the test
//! fails, naming the command that installs it; it never passes without having run. The
//! constants below pair each with that command, and `.ci/run` installs every one of them.
//!
//! This file needs nothing from bucketd, so a test crate that has no use for the rest of
//! `common` can take it alone (`#[path = "common/tools.rs"] mod tools;`).
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};

/// A program a test runs, and the command that installs it.
pub struct Tool {
    pub program: &'static str,
    pub install: &'static str,
}

/// Python modules a test's script imports, and the command that installs them.
pub struct PythonImports {
    /// Python statements that import them, e.g. `import redis`.
    pub imports: &'static str,
    pub install: &'static str,
}

pub const REDIS_SERVER: Tool = Tool {
    program: "redis-server",
    install: "apt-get install -y redis-server",
};
pub const REDIS_CLI: Tool = Tool {
    program: "redis-cli",
    install: "apt-get install -y redis-tools",
};
pub const PROMTOOL: Tool = Tool {
    program: "promtool",
    install: "apt-get install -y prometheus",
};
pub const TCLSH: Tool = Tool {
    program: "tclsh",
    install: "apt-get install -y tcl",
};
pub const PYTHON3: Tool = Tool {
    program: "python3",
    install: "apt-get install -y python3 python3-pip",
};
/// redis-py, with its cluster client.
pub const REDIS_PY: PythonImports = PythonImports {
    imports: "import redis; from redis.cluster import RedisCluster",
    install: "python3 -m pip install redis",
};
/// What tests/py/rls_test.py imports beyond the standard library: grpcio and Envoy's generated
/// protos.
pub const GRPC_PY: PythonImports = PythonImports {
    imports: "import grpc; from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc; \
              from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2; \
              from google.protobuf import wrappers_pb2",
    install: "python3 -m pip install grpcio xds-protos",
};

/// What tests/limiter-suites/run.py runs: pytest with the plugins the limiter packages' tests
/// use, the packages at the pinned versions run.py names (their tests come from their source
/// distributions, fetched at test time), and the Redis clients they test with.
pub const LIMITER_SUITES_PY: PythonImports = PythonImports {
    imports: "import pytest, pytest_asyncio, pytest_lazy_fixtures, pytest_rerunfailures, redis, \
              coredis, limits, pyrate_limiter, deprecated, packaging",
    install: "python3 -m pip install 'pytest<10' pytest-asyncio pytest-lazy-fixtures \
              pytest-rerunfailures redis 'coredis>=3.4,<6' limits==5.8.0 pyrate-limiter==4.6.0",
};

/// Fails the test unless `tool` is an executable file on PATH, with a message that names the
/// command installing it: `require_tool(REDIS_CLI)` fails with "redis-cli not found on PATH:
/// apt-get install -y redis-tools".
#[track_caller]
pub fn require_tool(tool: Tool) {
    if !on_path(tool.program) {
        panic!("{} not found on PATH: {}", tool.program, tool.install);
    }
}

/// Fails the test unless python3 runs `py.imports`, with a message that names the command
/// installing them: `require_python(REDIS_PY)`.
#[track_caller]
pub fn require_python(py: PythonImports) {
    require_tool(PYTHON3);
    let out = Command::new("python3")
        .args(["-c", py.imports])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("python3 does not run ({e}): {}", PYTHON3.install));
    if !out.status.success() {
        panic!(
            "python3 cannot `{}`: {}\n{}",
            py.imports,
            py.install,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
}

/// Whether `program` is an executable file in one of PATH's directories.
fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| executable(&dir.join(program))))
}
