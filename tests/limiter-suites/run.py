#!/usr/bin/env python3
"""Runs a rate-limiting package's own Redis storage tests against a server that is already
running: a real redis-server (the control) or a bucketd node.

    run.py SUITE HOST:PORT

SUITE is `limits` or `pyrate-limiter` (the pinned versions are below). The package's source
distribution, which carries its tests, is downloaded once with `pip download` into the cache
(BUCKETD_SUITES_CACHE, default ~/.cache/bucketd/limiter-suites) and unpacked afresh into a
temporary directory for every run, so the cached copy stays as published and runs can overlap.
The tests are then pointed at HOST:PORT:

- limits: its tests name `localhost:7379`, the docker compose fixture's port; that text is
  rewritten to HOST:PORT, and its conftest.py, which starts docker services and imports the
  memcached, MongoDB and Valkey clients, is replaced by limits_conftest.py beside this file.
  The plain Redis storage is selected by its own `redis` marker, sync and async; the async
  tests run once with each client library the package supports (coredis, its default, and
  redis-py's asyncio client).
- pyrate-limiter: its conftest reads the server's URL from REDIS, and some tests name
  `localhost:6379` outright, which is rewritten to HOST:PORT. The Redis buckets are selected by
  its `redis` and `asyncredis` markers, in the modules that have Redis tests (PYRATE_MODULES);
  the others test in-memory, SQLite, Postgres and HTTP-client integrations, and some import
  aiohttp or httpx, which are not installed.

Tests listed in skip.txt beside this file are deselected (bucketd_select.py). The last line
printed is `suite-counts: N passed, N failed, N errors, N skipped, N deselected`, summed over
the pytest runs; the exit status is 0 only when every run passed.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
SKIP = HERE / "skip.txt"

# The versions whose tests run. Raising one means reading the new tests' conftest and markers
# again, and checking skip.txt against them.
PINNED = {
    "limits": ("limits", "5.8.0"),
    "pyrate-limiter": ("pyrate_limiter", "4.6.0"),
}

# Seconds one pytest run may take before it is stopped.
RUN_TIMEOUT = int(os.environ.get("BUCKETD_SUITE_TIMEOUT", "900"))


def log(msg: str) -> None:
    print(f"limiter-suites: {msg}", flush=True)


def cache_dir() -> pathlib.Path:
    d = os.environ.get("BUCKETD_SUITES_CACHE")
    return pathlib.Path(d) if d else pathlib.Path.home() / ".cache/bucketd/limiter-suites"


def sdist(project: str, dist: str, version: str) -> pathlib.Path:
    """The cached source distribution, downloaded once (a lock keeps two runs from racing)."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{dist}-{version}.tar.gz"
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            log(f"pip download {project}=={version} (source distribution) into {cache}")
            tmp = pathlib.Path(tempfile.mkdtemp(dir=cache))
            try:
                subprocess.run(
                    [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                     "--no-binary", ":all:", f"{project}=={version}", "-d", str(tmp)],
                    check=True, timeout=300,
                )
                got = tmp / path.name
                if not got.exists():
                    raise SystemExit(f"pip download left no {path.name} in {tmp}")
                got.rename(path)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return path


def unpack(archive: pathlib.Path, into: pathlib.Path) -> pathlib.Path:
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    (root,) = [p for p in into.iterdir() if p.is_dir()]
    if not (root / "tests").is_dir():
        raise SystemExit(f"{archive.name} has no tests/ directory")
    return root


def rewrite(root: pathlib.Path, old: str, new: str) -> int:
    n = 0
    for f in (root / "tests").rglob("*.py"):
        text = f.read_text(encoding="utf-8")
        if old in text:
            f.write_text(text.replace(old, new), encoding="utf-8")
            n += 1
    return n


COUNTS = re.compile(
    r"^suite-counts: (\d+) passed, (\d+) failed, (\d+) errors, (\d+) skipped, (\d+) deselected$",
    re.M,
)


def pytest(root: pathlib.Path, suite: str, args: list[str], env: dict[str, str]) -> tuple[int, list[int]]:
    env = {**os.environ, **env, "BUCKETD_SUITE": suite, "BUCKETD_SUITE_SKIP": str(SKIP)}
    # The plugin is imported from this directory; the package is imported from the unpacked
    # source, which is the working directory.
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(root)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # Both packages assert on wall-clock time (a reset time within 30 ms, a window that has
    # passed after a sleep), which a busy machine can miss against Redis itself. A failed test
    # runs again, up to five times, a second apart (pytest-rerunfailures); the log shows each
    # rerun as RERUN. A behaviour that differs fails all six times.
    cmd = [sys.executable, "-m", "pytest", "-p", "bucketd_select", "-p", "no:cacheprovider",
           "-p", "no:randomly", "-o", "addopts=", "--reruns", "5", "--reruns-delay", "1", "-rfER", "--tb=short", "-v",
           *args]
    log(f"{' '.join(f'{k}={v}' for k, v in env.items() if k.startswith(('REDIS', 'ASYNC_')))} "
        f"{' '.join(cmd[1:])}")
    try:
        out = subprocess.run(cmd, cwd=root, env=env, timeout=RUN_TIMEOUT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except subprocess.TimeoutExpired as e:
        text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        print(text, flush=True)
        log(f"pytest took longer than {RUN_TIMEOUT}s and was stopped")
        return 1, [0, 1, 0, 0, 0]
    print(out.stdout, flush=True)
    m = list(COUNTS.finditer(out.stdout))
    counts = [int(x) for x in m[-1].groups()] if m else [0, 0, 1, 0, 0]
    return out.returncode, counts


def run_limits(root: pathlib.Path, addr: str) -> list[tuple[int, list[int]]]:
    if rewrite(root, "localhost:7379", addr) == 0:
        raise SystemExit("limits' tests no longer name localhost:7379: read their conftest again")
    shutil.copy(HERE / "limits_conftest.py", root / "tests/conftest.py")
    env = {"BUCKETD_SUITE_ADDR": addr}
    # The package's pytest.ini turns warnings into errors; pytest-asyncio warns when its
    # fixture loop scope is unset, which the package's ini leaves to the plugin's default.
    common = ["-m", "redis", "--ignore=tests/benchmarks",
              "-o", "asyncio_default_fixture_loop_scope=function"]
    return [
        # Every Redis storage test, the async ones on coredis (the package's default).
        pytest(root, "limits", [*common, "tests"],
               {**env, "ASYNC_REDIS_IMPLEMENTATION": "coredis", "BUCKETD_SUITE_CHECK_STALE": "1"}),
        # The async ones again, on redis-py's asyncio client.
        pytest(root, "limits", [*common, "tests/aio", "tests/integration", "-k", "async or aio"],
               {**env, "ASYNC_REDIS_IMPLEMENTATION": "redispy"}),
    ]


# pyrate-limiter's test modules that hold tests marked `redis` or `asyncredis`.
PYRATE_MODULES = [
    "tests/test_bucket_all.py",
    "tests/test_bucket_factory.py",
    "tests/test_closing.py",
    "tests/test_fixed_window.py",
    "tests/test_gcra.py",
    "tests/test_limiter.py",
    "tests/test_multi_bucket.py",
    "tests/test_redis_bucket.py",
]


def run_pyrate(root: pathlib.Path, addr: str) -> list[tuple[int, list[int]]]:
    if rewrite(root, "localhost:6379", addr) == 0:
        raise SystemExit("pyrate-limiter's tests no longer name localhost:6379: read them again")
    return [
        pytest(root, "pyrate-limiter", ["-m", "redis or asyncredis", *PYRATE_MODULES],
               {"REDIS": f"redis://{addr}", "BUCKETD_SUITE_CHECK_STALE": "1"}),
    ]


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in PINNED:
        print(f"usage: {sys.argv[0]} {{{'|'.join(PINNED)}}} HOST:PORT", file=sys.stderr)
        return 2
    suite, addr = sys.argv[1], sys.argv[2]
    dist, version = PINNED[suite]
    archive = sdist(suite, dist, version)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"bucketd-{suite}-"))
    try:
        root = unpack(archive, work)
        log(f"{suite} {version} against {addr}")
        runs = run_limits(root, addr) if suite == "limits" else run_pyrate(root, addr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = [sum(c[i] for _, c in runs) for i in range(5)]
    status = 0 if all(rc == 0 for rc, _ in runs) else 1
    print(f"suite-counts: {total[0]} passed, {total[1]} failed, {total[2]} errors, "
          f"{total[3]} skipped, {total[4]} deselected", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
