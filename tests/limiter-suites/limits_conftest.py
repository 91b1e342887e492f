"""Fixtures for the `limits` package's own tests, in place of its tests/conftest.py.

The package's conftest starts its servers with docker compose (lovely-pytest-docker) and imports
the memcached, MongoDB and Valkey clients at the top. Here the server is already running: the
harness starts it and rewrote the tests' `localhost:7379` to its address, which it also passes
in BUCKETD_SUITE_ADDR. Only the fixtures of the plain Redis storage are defined; the tests of
other storages are deselected (by marker, and in skip.txt).
"""

from __future__ import annotations

import os

import pytest
import redis

HOST, PORT = os.environ["BUCKETD_SUITE_ADDR"].rsplit(":", 1)


@pytest.fixture(scope="session")
def redis_basic_client():
    client = redis.StrictRedis(HOST, int(PORT))
    yield client
    client.close()


@pytest.fixture
def redis_basic(redis_basic_client):
    # As the package's own fixture: every test starts from an empty keyspace.
    redis_basic_client.flushall()
    return redis_basic_client


def pytest_configure(config):
    # The package marks its memcached storages `flaky` (pytest-rerunfailures); those tests are
    # not run here, but the mark must be known for the modules to import under its
    # warnings-as-errors setting.
    config.addinivalue_line("markers", "flaky: rerun a flaky test (unused here)")
