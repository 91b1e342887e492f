#!/usr/bin/env python3
"""Smoke test of a running bucketd with redis-py, over RESP2 and RESP3.

Usage: smoke.py PORT [HOST]. Exits 0 when every check passes, 1 otherwise.
"""

import sys

import redis


def expect(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: expected {want!r}, got {got!r}")


def smoke(host, port, protocol):
    r = redis.Redis(
        host=host,
        port=port,
        protocol=protocol,
        socket_timeout=10,
        socket_connect_timeout=10,
        decode_responses=True,
    )
    p = f"py{protocol}:"
    r.delete(p + "k", p + "n", p + "user123", p + "bucket", p + "fixed")

    expect(r.ping(), True, "PING")
    expect(r.echo("hi"), "hi", "ECHO")
    expect(r.set(p + "k", "v"), True, "SET")
    expect(r.get(p + "k"), "v", "GET")
    expect(r.get(p + "missing"), None, "GET missing")
    expect(r.set(p + "k", "w", nx=True), None, "SET NX on an existing key")
    expect(r.incr(p + "n"), 1, "INCR")
    expect(r.incrby(p + "n", 41), 42, "INCRBY")
    expect(r.decr(p + "n"), 41, "DECR")
    expect(r.expire(p + "n", 100), True, "EXPIRE")
    ttl = r.ttl(p + "n")
    if not 95 <= ttl <= 100:
        raise AssertionError(f"TTL: expected about 100, got {ttl!r}")
    expect(r.ttl(p + "missing"), -2, "TTL missing")
    expect(r.exists(p + "k", p + "n", p + "missing"), 2, "EXISTS")
    try:
        r.incr(p + "k")
        raise AssertionError("INCR on a string should fail")
    except redis.ResponseError as e:
        expect(str(e), "value is not an integer or out of range", "INCR error")

    expect(
        r.execute_command("CL.THROTTLE", p + "user123", 15, 30, 60),
        [0, 16, 15, -1, 2],
        "CL.THROTTLE first call",
    )
    first = r.execute_command("BK.CHECK", p + "bucket", "10/1s")
    expect(first[:3], [1, 10, 9], "BK.CHECK first call")
    for left in range(8, -1, -1):
        expect(r.execute_command("BK.CHECK", p + "bucket", "10/1s")[:3], [1, 10, left], "BK.CHECK")
    denied = r.execute_command("BK.CHECK", p + "bucket", "10/1s")
    if denied[0] != 0 or denied[3] <= 0:
        raise AssertionError(f"BK.CHECK past the limit: {denied!r}")
    peek = r.execute_command("BK.CHECK", p + "fixed", "fixed:3/1m", "COST", "2", "PEEK")
    expect(peek[:3], [1, 3, 1], "BK.CHECK PEEK")
    expect(r.exists(p + "fixed"), 0, "PEEK stores nothing")
    allv = r.execute_command("BK.CHECKALL", 2, p + "ca", p + "cb", "5/1s", "fixed:2/1s")
    expect(allv[:3], [1, 2, 1], "BK.CHECKALL summary")
    expect(len(allv[5]), 2, "BK.CHECKALL entries")

    # Pipelines (without MULTI): replies in order, across shards.
    pipe = r.pipeline(transaction=False)
    for i in range(200):
        pipe.set(f"{p}pipe:{i}", i)
        pipe.incr(f"{p}pipe:{i}")
        pipe.execute_command("CL.THROTTLE", f"{p}pipe-cell:{i}", 0, 1, 60)
    out = pipe.execute()
    for i in range(200):
        expect(out[3 * i], True, f"pipelined SET {i}")
        expect(out[3 * i + 1], i + 1, f"pipelined INCR {i}")
        expect(out[3 * i + 2], [0, 1, 0, -1, 60], f"pipelined CL.THROTTLE {i}")
    expect(r.delete(*[f"{p}pipe:{i}" for i in range(200)]), 200, "DEL across shards")

    expect(r.client_setname(f"smoke-{protocol}"), True, "CLIENT SETNAME")
    expect(r.client_getname(), f"smoke-{protocol}", "CLIENT GETNAME")
    expect(r.config_get("appendonly"), {"appendonly": "no"}, "CONFIG GET")
    info = r.info("server")
    if "redis_version" not in info:
        raise AssertionError(f"INFO server: {info!r}")
    if protocol == 3:
        hello = r.execute_command("HELLO", 3)
        expect(hello.get("proto"), 3, "HELLO 3 proto")
    r.close()


def main():
    if len(sys.argv) < 2:
        print("usage: smoke.py PORT [HOST]", file=sys.stderr)
        return 2
    port = int(sys.argv[1])
    host = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
    major = int(redis.__version__.split(".")[0])
    protocols = [2, 3] if major >= 5 else [2]
    failed = 0
    for protocol in protocols:
        try:
            smoke(host, port, protocol)
            print(f"redis-py {redis.__version__} RESP{protocol}: ok")
        except Exception as e:  # report every protocol's failure, then fail
            failed += 1
            print(f"redis-py {redis.__version__} RESP{protocol}: FAILED: {e!r}", file=sys.stderr)
    print(f"{len(protocols) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
