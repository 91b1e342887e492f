"""A pytest plugin for the limiter suites: deselects the tests skip.txt lists for this suite and
prints one closing line of counts that tests/limiter_suites.rs reads.

BUCKETD_SUITE names the suite (`limits`, `pyrate-limiter`); BUCKETD_SUITE_SKIP is the path of
skip.txt. An entry is `<suite> <pattern>`, where the pattern is matched against the whole pytest
node id and `*` is the only wildcard (node ids hold `[` and `]`, which stay literal). Every
entry must match at least one collected test, so a renamed test cannot leave a stale entry.
"""

from __future__ import annotations

import os
import re

import pytest

_SUITE = os.environ.get("BUCKETD_SUITE", "")
_COUNTS = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "deselected": 0}
_STALE: list[str] = []


def _entries() -> list[str]:
    path = os.environ.get("BUCKETD_SUITE_SKIP")
    if not path:
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            suite, _, pattern = line.partition(" ")
            if suite == _SUITE:
                out.append(pattern.strip())
    return out


def _matcher(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(p) for p in pattern.split("*")) + r"\Z")


def pytest_collection_modifyitems(config, items):
    patterns = [(p, _matcher(p)) for p in _entries()]
    used = set()
    keep, drop = [], []
    for item in items:
        hit = next((p for p, rx in patterns if rx.match(item.nodeid)), None)
        if hit is None:
            keep.append(item)
        else:
            used.add(hit)
            drop.append(item)
    # A pattern for tests the marker expression already left out matches nothing here; only
    # a run over the whole selection can call it stale.
    if os.environ.get("BUCKETD_SUITE_CHECK_STALE") == "1":
        _STALE.extend(p for p, _ in patterns if p not in used)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    # The packages mark their wall-clock tests `flaky` (for the `flaky` plugin, which is not
    # installed): pytest-rerunfailures reads that marker as one rerun, over the command line's
    # count. A closer marker gives them the same reruns as every other test.
    reruns = config.getoption("reruns", default=None) or 0
    delay = config.getoption("reruns_delay", default=None) or 0
    for item in keep:
        if reruns and item.get_closest_marker("flaky") is not None:
            item.add_marker(pytest.mark.flaky(reruns=reruns, reruns_delay=delay), append=False)


def pytest_deselected(items):
    _COUNTS["deselected"] += len(items)


def pytest_collectreport(report):
    if report.failed:
        _COUNTS["errors"] += 1


def pytest_runtest_logreport(report):
    if report.when == "call":
        if report.passed:
            _COUNTS["passed"] += 1
        elif report.failed:
            _COUNTS["failed"] += 1
        elif report.skipped:
            _COUNTS["skipped"] += 1
    elif report.failed:
        _COUNTS["errors"] += 1
    elif report.skipped:
        _COUNTS["skipped"] += 1


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    for p in _STALE:
        terminalreporter.write_line(f"skip.txt entry matches no test: {_SUITE} {p}")
    if _STALE:
        _COUNTS["errors"] += 1
    c = _COUNTS
    terminalreporter.write_line(
        f"suite-counts: {c['passed']} passed, {c['failed']} failed, {c['errors']} errors, "
        f"{c['skipped']} skipped, {c['deselected']} deselected"
    )
