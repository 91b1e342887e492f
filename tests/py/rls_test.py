#!/usr/bin/env python3
"""Envoy's rate limit service on a bucketd node, asked through a gRPC client generated from
Envoy's published protos (grpcio and xds-protos), the way Envoy asks it.

Usage: rls_test.py GRPC_PORT METRICS_PORT CONFIG_DIR

tests/rls.rs runs it against a node whose --rls-config is CONFIG_DIR, a copy of tests/py/rls/:
five files taken unchanged from envoyproxy/ratelimit's README (Examples 2, 3, 5, 6 and 9), and
reload.yaml, which the hot-reload case rewrites. The node answers with the RateLimit-* headers
on, and runs on a manual clock that starts at RLS_TEST_CLOCK_MS (milliseconds since the epoch,
on a whole second). The clock moves only when this script prints `ADVANCE <ms>` and reads `OK`
back on stdin, so every window and reset below is exact. Every other line it prints is its
report: PASS or FAIL per case, with each mismatch as expected versus got. It exits 1 if any case
failed.
"""

import math
import os
import select
import sys
import time
import traceback
import urllib.request

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import wrappers_pb2

OK = rls_pb2.RateLimitResponse.Code.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.Code.OVER_LIMIT
Unit = rls_pb2.RateLimitResponse.RateLimit.Unit
UNIT_MS = {
    Unit.SECOND: 1_000,
    Unit.MINUTE: 60_000,
    Unit.HOUR: 3_600_000,
    Unit.DAY: 86_400_000,
}
U32_MAX = 4294967295

# Bounds on everything that waits: one gRPC call, one reply from the driver, one condition.
CALL_TIMEOUT = 5
DRIVER_TIMEOUT = 10
CONDITION_TIMEOUT = 10


class Clock:
    """The node's clock as this script has moved it."""

    def __init__(self, start_ms):
        self.now_ms = start_ms

    def advance(self, ms):
        print(f"ADVANCE {ms}", flush=True)
        ready, _, _ = select.select([sys.stdin], [], [], DRIVER_TIMEOUT)
        if not ready:
            raise RuntimeError(f"no answer to ADVANCE {ms} within {DRIVER_TIMEOUT} s")
        line = sys.stdin.readline().strip()
        if line != "OK":
            raise RuntimeError(f"ADVANCE {ms} answered {line!r}")
        self.now_ms += ms

    def to_next_window(self, unit):
        """Moves the clock to the start of the next window of `unit` (aligned to the epoch)."""
        self.advance(UNIT_MS[unit] - self.now_ms % UNIT_MS[unit])

    def until_reset_ms(self, unit):
        return UNIT_MS[unit] - self.now_ms % UNIT_MS[unit]


class Failed(Exception):
    """Ends a case: with the reason, or with none when the reason is already recorded."""


class Case:
    """One case's checks: a mismatch is recorded and the case goes on, so one run reports all
    of them."""

    def __init__(self, name):
        self.name = name
        self.failures = []

    def eq(self, got, want, what):
        if got != want:
            self.failures.append(f"{what}: expected {want!r}, got {got!r}")
        return got == want

    def true(self, cond, what):
        if not cond:
            self.failures.append(what)
        return bool(cond)

    def stop_unless(self, cond, what):
        """A check the rest of the case depends on."""
        if not self.true(cond, what):
            raise Failed()


def desc(*entries, hits=None):
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    return d


class Service:
    def __init__(self, port):
        self.target = f"127.0.0.1:{port}"
        self.channel = self.open()

    def open(self):
        ch = grpc.insecure_channel(
            self.target,
            options=[
                ("grpc.max_send_message_length", 8 << 20),
                ("grpc.max_receive_message_length", 8 << 20),
            ],
        )
        grpc.channel_ready_future(ch).result(timeout=CALL_TIMEOUT)
        return ch

    def ask(self, domain, *descriptors, hits=0, channel=None):
        req = rls_pb2.RateLimitRequest(
            domain=domain, descriptors=list(descriptors), hits_addend=hits
        )
        stub = rls_pb2_grpc.RateLimitServiceStub(channel or self.channel)
        return stub.ShouldRateLimit(req, timeout=CALL_TIMEOUT)

    def refused(self, c, what, domain, *descriptors, hits=0):
        """The gRPC error a request gets; records a failure if it was answered instead."""
        try:
            r = self.ask(domain, *descriptors, hits=hits)
        except grpc.RpcError as e:
            return e
        c.true(False, f"{what}: expected a gRPC error, got an answer {short(r)}")
        return None


def limit_of(s):
    """A status's current limit as (requests_per_unit, unit), None when it has none."""
    if not s.HasField("current_limit"):
        return None
    return (s.current_limit.requests_per_unit, s.current_limit.unit)


def reset_ms(s):
    return s.duration_until_reset.seconds * 1000 + s.duration_until_reset.nanos // 1_000_000


def headers(r):
    return {h.key: h.value for h in r.response_headers_to_add}


def short(r):
    """A response on one line, for the report."""
    parts = []
    for s in r.statuses:
        lim = limit_of(s)
        lim = f"{lim[0]}/{Unit.Name(lim[1])}" if lim else "none"
        parts.append(
            f"({rls_pb2.RateLimitResponse.Code.Name(s.code)} limit={lim} "
            f"remaining={s.limit_remaining})"
        )
    return f"{rls_pb2.RateLimitResponse.Code.Name(r.overall_code)} [{' '.join(parts)}]"


def expect_status(c, s, what, code, limit, remaining=None):
    c.eq(rls_pb2.RateLimitResponse.Code.Name(s.code),
         rls_pb2.RateLimitResponse.Code.Name(code), f"{what}: code")
    c.eq(limit_of(s), limit, f"{what}: current_limit (requests_per_unit, unit)")
    if remaining is not None:
        c.eq(s.limit_remaining, remaining, f"{what}: limit_remaining")


def metrics(port):
    """The node's samples, by `name{labels}` as the text writes them."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=CALL_TIMEOUT) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


def wait_until(what, check):
    """Polls `check` until it returns something true, for at most CONDITION_TIMEOUT seconds:
    waiting for the node to see a file change, which it polls on real time."""
    deadline = time.monotonic() + CONDITION_TIMEOUT
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.02)
    raise Failed(f"timed out after {CONDITION_TIMEOUT} s waiting for {what} (last: {last!r})")


def write_atomically(path, text):
    """Replaces a file in one rename, from a hidden name the node does not read."""
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


CASES = []


def case(name):
    def register(f):
        CASES.append((name, f))
        return f

    return register


@case("1 README configurations: matching as envoyproxy/ratelimit matches")
def readme_matching(c, svc, clock, env):
    day = (5, Unit.DAY)
    # Example 2: a nested descriptor under a value, and a key alone at the top.
    r = svc.ask("messaging", desc(("message_type", "marketing"), ("to_number", "2061111111")))
    c.eq(r.overall_code, OK, "nested marketing descriptor: overall code")
    expect_status(c, r.statuses[0], "nested marketing descriptor", OK, day, 4)
    c.eq(reset_ms(r.statuses[0]), clock.until_reset_ms(Unit.DAY),
         "a day limit resets at the next whole day since the epoch (ms)")
    r = svc.ask("messaging", desc(("message_type", "marketing"), ("to_number", "2062222222")))
    expect_status(c, r.statuses[0], "another to_number under marketing counts on its own", OK,
                  day, 4)
    r = svc.ask("messaging", desc(("message_type", "marketing"), ("to_number", "2061111111")))
    expect_status(c, r.statuses[0], "the first to_number again", OK, day, 3)
    # The README's request: both descriptors in one call, answered in order.
    r = svc.ask(
        "messaging",
        desc(("message_type", "marketing"), ("to_number", "2061111111")),
        desc(("to_number", "2061111111")),
    )
    c.eq(len(r.statuses), 2, "two descriptors, two statuses")
    expect_status(c, r.statuses[0], "README request, marketing", OK, day, 2)
    expect_status(c, r.statuses[1], "README request, any to_number", OK, (100, Unit.DAY), 99)
    r = svc.ask("messaging", desc(("to_number", "2062222222")))
    expect_status(c, r.statuses[0], "a second to_number at the top counts on its own", OK,
                  (100, Unit.DAY), 99)
    # Depth: the placeholder level has no limit, and a descriptor deeper than the tree matches
    # nothing.
    for what, d in [
        ("the placeholder (message_type, marketing) alone", desc(("message_type", "marketing"))),
        ("a descriptor one entry deeper than the tree",
         desc(("to_number", "2061111111"), ("extra", "x"))),
        ("a value the level does not list, under a key it lists by value",
         desc(("message_type", "transactional"), ("to_number", "2061111111"))),
        ("a key the domain does not have", desc(("database", "users"))),
    ]:
        r = svc.ask("messaging", d)
        c.eq(r.overall_code, OK, f"{what}: overall code")
        expect_status(c, r.statuses[0], what, OK, None)

    # Example 3: the most specific match first, and a block-listed value.
    r = svc.ask("edge_proxy_per_ip", desc(("remote_address", "50.0.0.1")))
    expect_status(c, r.statuses[0], "remote_address by key", OK, (10, Unit.SECOND), 9)
    for i in range(3):
        r = svc.ask("edge_proxy_per_ip", desc(("remote_address", "50.0.0.5")))
        c.eq(r.overall_code, OVER_LIMIT, f"block-listed 50.0.0.5, call {i + 1}: overall code")
        expect_status(c, r.statuses[0], f"block-listed 50.0.0.5, call {i + 1}", OVER_LIMIT,
                      (0, Unit.SECOND), 0)
    clock.to_next_window(Unit.SECOND)
    r = svc.ask("edge_proxy_per_ip", desc(("remote_address", "50.0.0.5")))
    expect_status(c, r.statuses[0], "block-listed 50.0.0.5 in the next window", OVER_LIMIT,
                  (0, Unit.SECOND), 0)

    # Example 5: unlimited answers OK with the most there is, and no limit to show.
    for i in range(3):
        r = svc.ask("internal", desc(("ldap", "cn=admin")))
        c.eq(r.overall_code, OK, "unlimited ldap: overall code")
        c.eq(r.statuses[0].code, OK, "unlimited ldap: code")
        c.eq(r.statuses[0].limit_remaining, U32_MAX, "unlimited ldap: limit_remaining")
        c.eq(limit_of(r.statuses[0]), None, "unlimited ldap: current_limit")
    r = svc.ask("internal", desc(("azure", "tenant-1")))
    expect_status(c, r.statuses[0], "azure next to unlimited ldap", OK, (100, Unit.MINUTE), 99)

    # Example 9: a trailing wildcard, each matching value counted on its own.
    r = svc.ask("example9", desc(("key1", "value1")))
    expect_status(c, r.statuses[0], "key1=value1 under value*", OK, (20, Unit.MINUTE), 19)
    r = svc.ask("example9", desc(("key1", "value1")))
    expect_status(c, r.statuses[0], "key1=value1 again", OK, (20, Unit.MINUTE), 18)
    r = svc.ask("example9", desc(("key1", "valueXYZ")))
    expect_status(c, r.statuses[0], "key1=valueXYZ counts on its own", OK, (20, Unit.MINUTE), 19)
    r = svc.ask("example9", desc(("key1", "value")))
    expect_status(c, r.statuses[0], "key1=value (the * matching nothing)", OK,
                  (20, Unit.MINUTE), 19)
    for v in ["valu", "xvalue1", "Value1"]:
        r = svc.ask("example9", desc(("key1", v)))
        expect_status(c, r.statuses[0], f"key1={v} does not match value*", OK, None)

    # A domain no file names: OK, one status per descriptor, no limits.
    r = svc.ask("no_such_domain", desc(("to_number", "1")), desc(("remote_address", "50.0.0.5")))
    c.eq(r.overall_code, OK, "unknown domain: overall code")
    c.eq(len(r.statuses), 2, "unknown domain: one status per descriptor")
    for i, s in enumerate(r.statuses):
        expect_status(c, s, f"unknown domain, descriptor {i}", OK, None)
    c.eq(headers(r), {}, "unknown domain: no RateLimit-* headers")


@case("2 over the limit, and OK again in the next window")
def over_limit(c, svc, clock, env):
    # 300 ms into a second: a window that began at the first request would outlast this one.
    clock.to_next_window(Unit.SECOND)
    clock.advance(300)
    ip = desc(("remote_address", "10.2.0.1"))
    for n in range(10):
        r = svc.ask("edge_proxy_per_ip", ip)
        c.eq(r.overall_code, OK, f"call {n + 1} of 10: overall code")
        expect_status(c, r.statuses[0], f"call {n + 1} of 10", OK, (10, Unit.SECOND), 9 - n)
    r = svc.ask("edge_proxy_per_ip", ip)
    c.eq(r.overall_code, OVER_LIMIT, "the 11th in the second: overall code")
    s = r.statuses[0]
    expect_status(c, s, "the 11th in the second", OVER_LIMIT, (10, Unit.SECOND), 0)
    c.true(s.HasField("duration_until_reset"), "the 11th has a duration_until_reset")
    c.true(0 < reset_ms(s) <= 1000,
           f"duration_until_reset within one second, got {reset_ms(s)} ms")
    c.eq(reset_ms(s), clock.until_reset_ms(Unit.SECOND), "duration_until_reset (ms)")
    c.eq(headers(r), {"RateLimit-Limit": "10", "RateLimit-Remaining": "0", "RateLimit-Reset": "1"},
         "headers of the 11th")
    # The same window until the second is over.
    clock.advance(699)
    r = svc.ask("edge_proxy_per_ip", ip)
    expect_status(c, r.statuses[0], "1 ms before the window turns", OVER_LIMIT,
                  (10, Unit.SECOND), 0)
    c.eq(reset_ms(r.statuses[0]), 1, "duration_until_reset 1 ms before the window turns (ms)")
    clock.advance(1)
    r = svc.ask("edge_proxy_per_ip", ip)
    c.eq(r.overall_code, OK, "the next window: overall code")
    expect_status(c, r.statuses[0], "the next window", OK, (10, Unit.SECOND), 9)
    c.eq(reset_ms(r.statuses[0]), 1000, "duration_until_reset at a window's start (ms)")


def crc16(data):
    """CRC16-XMODEM, Redis Cluster's key hash."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1) & 0xFFFF
    return crc


def shard_of(domain, entries, shards=2):
    """The shard of the test node's two that a descriptor's counter lives on: bucketd's counter
    name (tests/rls.rs confirms it against the node) and its standalone slot-to-shard map. Used
    only to pick descriptors that do or do not share a shard; nothing is asserted from it."""
    name = f"rls:{len(domain)}:{domain}" + "".join(
        f":{len(k)}:{k}:{len(v)}:{v}" for k, v in entries
    )
    return (crc16(name.encode()) & 16383) % shards


@case("3 all or nothing across a request's descriptors")
def all_or_nothing(c, svc, clock, env):
    def entries(n):
        return [("message_type", "marketing"), ("to_number", n)], [("to_number", n)]

    def apart(n):
        marketing, anyone = entries(n)
        return shard_of("messaging", marketing) != shard_of("messaging", anyone)

    # For numbers of one length the two counters are either always on one shard or always
    # apart (the hash is linear in the bytes that differ), so the numbers are of two lengths.
    numbers = [str(n) for n in range(2063333300, 2063333310)]
    numbers += [str(n) for n in range(206333300, 206333310)]
    for placement, n in [
        ("on one shard", next(n for n in numbers if not apart(n))),
        ("on two shards", next(n for n in numbers if apart(n))),
    ]:
        marketing, anyone = (desc(*e) for e in entries(n))
        for left in range(4, -1, -1):
            r = svc.ask("messaging", marketing)
            expect_status(c, r.statuses[0], f"{placement}: using up marketing", OK,
                          (5, Unit.DAY), left)
        r = svc.ask("messaging", anyone)
        expect_status(c, r.statuses[0], f"{placement}: to_number alone", OK,
                      (100, Unit.DAY), 99)
        r = svc.ask("messaging", anyone, marketing)
        c.eq(r.overall_code, OVER_LIMIT,
             f"{placement}: to_number, then exhausted marketing: overall code")
        c.eq(len(r.statuses), 2, f"{placement}: two statuses")
        expect_status(c, r.statuses[0], f"{placement}: first status (to_number, within)", OK,
                      (100, Unit.DAY), 99)
        expect_status(c, r.statuses[1], f"{placement}: second status (marketing, over)",
                      OVER_LIMIT, (5, Unit.DAY), 0)
        r = svc.ask("messaging", marketing, anyone)
        c.eq(r.overall_code, OVER_LIMIT, f"{placement}, the other order: overall code")
        expect_status(c, r.statuses[0], f"{placement}, the other order: first status "
                      "(marketing, over)", OVER_LIMIT, (5, Unit.DAY), 0)
        expect_status(c, r.statuses[1], f"{placement}, the other order: second status "
                      "(to_number, within)", OK, (100, Unit.DAY), 99)
        r = svc.ask("messaging", anyone)
        expect_status(c, r.statuses[0], f"{placement}: to_number after two refused requests "
                      "(nothing was taken from it)", OK, (100, Unit.DAY), 98)

    # A block-listed descriptor refuses the request too, and takes nothing from the others.
    clock.to_next_window(Unit.SECOND)
    ip = desc(("remote_address", "10.3.0.1"))
    r = svc.ask("edge_proxy_per_ip", ip)
    expect_status(c, r.statuses[0], "an address before the block-listed one", OK,
                  (10, Unit.SECOND), 9)
    r = svc.ask("edge_proxy_per_ip", ip, desc(("remote_address", "50.0.0.5")))
    c.eq(r.overall_code, OVER_LIMIT, "with a block-listed address: overall code")
    expect_status(c, r.statuses[0], "with a block-listed address, first status", OK,
                  (10, Unit.SECOND), 9)
    expect_status(c, r.statuses[1], "with a block-listed address, second status", OVER_LIMIT,
                  (0, Unit.SECOND), 0)
    r = svc.ask("edge_proxy_per_ip", ip)
    expect_status(c, r.statuses[0], "the address after (nothing was taken from it)", OK,
                  (10, Unit.SECOND), 8)


@case("4 hits_addend: per request, per descriptor, and hits that do not fit")
def hits_addend(c, svc, clock, env):
    clock.to_next_window(Unit.SECOND)
    a = ("remote_address", "10.4.0.1")
    r = svc.ask("edge_proxy_per_ip", desc(a), hits=3)
    expect_status(c, r.statuses[0], "request hits_addend 3", OK, (10, Unit.SECOND), 7)
    r = svc.ask("edge_proxy_per_ip", desc(a, hits=5), hits=3)
    expect_status(c, r.statuses[0], "descriptor hits_addend 5 over request's 3", OK,
                  (10, Unit.SECOND), 2)
    r = svc.ask("edge_proxy_per_ip", desc(a, hits=0), hits=3)
    expect_status(c, r.statuses[0], "descriptor hits_addend 0 (look, do not take)", OK,
                  (10, Unit.SECOND), 2)
    r = svc.ask("edge_proxy_per_ip", desc(a), hits=3)
    c.eq(r.overall_code, OVER_LIMIT, "3 hits with 2 left: overall code")
    # envoyproxy/ratelimit reports nothing remaining for a descriptor it refuses, and Envoy's
    # own rate limit headers are built from that figure.
    expect_status(c, r.statuses[0], "3 hits with 2 left", OVER_LIMIT, (10, Unit.SECOND), 0)
    r = svc.ask("edge_proxy_per_ip", desc(a), hits=2)
    expect_status(c, r.statuses[0], "2 hits after the refused 3 (the 3 were not taken)", OK,
                  (10, Unit.SECOND), 0)
    r = svc.ask("edge_proxy_per_ip", desc(a))
    expect_status(c, r.statuses[0], "one more when none is left", OVER_LIMIT,
                  (10, Unit.SECOND), 0)

    # Each descriptor with its own count, in one request.
    b = ("remote_address", "10.4.0.2")
    d = ("remote_address", "10.4.0.3")
    r = svc.ask("edge_proxy_per_ip", desc(b), desc(d, hits=4), hits=2)
    c.eq(r.overall_code, OK, "two descriptors with 2 and 4 hits: overall code")
    expect_status(c, r.statuses[0], "the request's 2 hits", OK, (10, Unit.SECOND), 8)
    expect_status(c, r.statuses[1], "the descriptor's own 4 hits", OK, (10, Unit.SECOND), 6)
    # 7 more on d do not fit: nothing is taken from b either.
    r = svc.ask("edge_proxy_per_ip", desc(b), desc(d, hits=7), hits=2)
    c.eq(r.overall_code, OVER_LIMIT, "7 hits with 6 left: overall code")
    c.eq(r.statuses[1].code, OVER_LIMIT, "7 hits with 6 left: code")
    expect_status(c, r.statuses[0], "the other descriptor of the refused request", OK,
                  (10, Unit.SECOND), 8)
    r = svc.ask("edge_proxy_per_ip", desc(b, hits=0), desc(d, hits=0))
    expect_status(c, r.statuses[0], "b after the refused request", OK, (10, Unit.SECOND), 8)
    expect_status(c, r.statuses[1], "d after the refused request", OK, (10, Unit.SECOND), 6)


@case("5 RateLimit-* headers from the limited descriptor with the least remaining")
def response_headers(c, svc, clock, env):
    n = "2064444444"
    marketing = desc(("message_type", "marketing"), ("to_number", n))
    anyone = desc(("to_number", n))
    day_reset = str(math.ceil(clock.until_reset_ms(Unit.DAY) / 1000))
    r = svc.ask("messaging", anyone, marketing)
    c.eq(headers(r), {"RateLimit-Limit": "5", "RateLimit-Remaining": "4",
                      "RateLimit-Reset": day_reset},
         "to_number (99 left), then marketing (4 left)")
    r = svc.ask("messaging", marketing, anyone)
    c.eq(headers(r), {"RateLimit-Limit": "5", "RateLimit-Remaining": "3",
                      "RateLimit-Reset": day_reset},
         "marketing (3 left), then to_number (98 left)")
    # A descriptor with no limit has limit_remaining 0 in its status, but no limit to report.
    r = svc.ask("messaging", desc(("database", "users")), anyone)
    c.eq(headers(r), {"RateLimit-Limit": "100", "RateLimit-Remaining": "97",
                      "RateLimit-Reset": day_reset},
         "an unmatched descriptor, then to_number")
    minute_reset = str(math.ceil(clock.until_reset_ms(Unit.MINUTE) / 1000))
    r = svc.ask("internal", desc(("ldap", "x")), desc(("azure", "tenant-5")))
    c.eq(headers(r), {"RateLimit-Limit": "100", "RateLimit-Remaining": "99",
                      "RateLimit-Reset": minute_reset},
         "unlimited ldap, then azure")
    for what, domain, d in [
        ("only unlimited", "internal", desc(("ldap", "x"))),
        ("only unmatched", "messaging", desc(("database", "users"))),
        ("unknown domain", "no_such_domain", desc(("k", "v"))),
    ]:
        r = svc.ask(domain, d)
        c.eq(headers(r), {}, f"{what}: no headers")
    # Over the limit: the refusing descriptor's, with nothing remaining (as envoyproxy answers),
    # even when it was refused hits that did not fit and another descriptor has less left.
    n = "2065555555"
    marketing = desc(("message_type", "marketing"), ("to_number", n), hits=3)
    svc.ask("messaging", desc(("to_number", n)), hits=99)
    svc.ask("messaging", marketing)
    r = svc.ask("messaging", desc(("message_type", "marketing"), ("to_number", n), hits=3),
                desc(("to_number", n), hits=0))
    c.eq(r.overall_code, OVER_LIMIT, "3 marketing hits with 2 left: overall code")
    c.eq(headers(r), {"RateLimit-Limit": "5", "RateLimit-Remaining": "0",
                      "RateLimit-Reset": day_reset},
         "3 marketing hits with 2 left, and to_number with 1 left")
    clock.to_next_window(Unit.SECOND)
    r = svc.ask("edge_proxy_per_ip", desc(("remote_address", "10.5.0.1")),
                desc(("remote_address", "50.0.0.5")))
    c.eq(r.overall_code, OVER_LIMIT, "a block-listed address: overall code")
    c.eq(headers(r), {"RateLimit-Limit": "0", "RateLimit-Remaining": "0",
                      "RateLimit-Reset": "1"},
         "an address with 10 left, and a block-listed one")


@case("6 shadow mode: over the limit, answered OK, and counted")
def shadow_mode(c, svc, clock, env):
    rule_a = "example6.service.user_user-a"
    rule_b = "example6.service.user_user-b"

    def counts(m, rule):
        return {
            kind: m.get(f'ratelimit_service_rate_limit_{kind}_total{{rule="{rule}"}}', 0.0)
            for kind in ["shadow_mode", "over_limit", "within_limit", "total_hits"]
        }

    before = metrics(env["metrics_port"])
    before_a, before_b = counts(before, rule_a), counts(before, rule_b)
    clock.to_next_window(Unit.SECOND)
    a = desc(("service", "auth-service"), ("user", "user-a"))
    for n in range(12):
        r = svc.ask("example6", a)
        c.eq(r.overall_code, OK, f"user-a call {n + 1} of 12: overall code")
        c.eq(r.statuses[0].code, OK, f"user-a call {n + 1} of 12: code")
        c.eq(limit_of(r.statuses[0]), (10, Unit.SECOND), f"user-a call {n + 1}: current_limit")
    c.eq(r.statuses[0].limit_remaining, 0, "user-a over its shadow limit: limit_remaining")
    b = desc(("service", "auth-service"), ("user", "user-b"))
    for n in range(20):
        svc.ask("example6", b)
    r = svc.ask("example6", b)
    c.eq(r.overall_code, OVER_LIMIT, "user-b's 21st: overall code (not in shadow mode)")
    expect_status(c, r.statuses[0], "user-b's 21st", OVER_LIMIT, (20, Unit.SECOND), 0)

    after = metrics(env["metrics_port"])
    got_a = {k: v - before_a[k] for k, v in counts(after, rule_a).items()}
    got_b = {k: v - before_b[k] for k, v in counts(after, rule_b).items()}
    c.eq(got_a, {"shadow_mode": 2, "over_limit": 2, "within_limit": 10, "total_hits": 12},
         f"counters of {rule_a}")
    c.eq(got_b, {"shadow_mode": 0, "over_limit": 1, "within_limit": 20, "total_hits": 21},
         f"counters of {rule_b}")


@case("7 hot reload: a changed limit applies, a broken file is refused and the old kept")
def hot_reload(c, svc, clock, env):
    path = os.path.join(env["config_dir"], "reload.yaml")
    probe = desc(("k", "probe"), hits=0)

    def limit_now():
        return limit_of(svc.ask("reload", probe).statuses[0])

    def reloads(result):
        return metrics(env["metrics_port"]).get(
            f'bucketd_rls_config_reloads_total{{result="{result}"}}', 0.0
        )

    def config(requests_per_unit, extra=""):
        return (
            "domain: reload\n"
            "descriptors:\n"
            "  - key: k\n"
            "    rate_limit:\n"
            "      unit: minute\n"
            f"      requests_per_unit: {requests_per_unit}\n"
            f"{extra}"
        )

    c.stop_unless(c.eq(limit_now(), (3, Unit.MINUTE), "the limit the node started with"),
                  "the starting configuration is not in force")
    ok_before = reloads("success")
    write_atomically(path, config(7))
    wait_until("the new limit (7) to answer", lambda: limit_now() == (7, Unit.MINUTE))
    wait_until("the reload to be counted", lambda: reloads("success") > ok_before)
    r = svc.ask("messaging", desc(("to_number", "2067777777")))
    expect_status(c, r.statuses[0], "another file of the directory after the reload", OK,
                  (100, Unit.DAY), 99)

    broken = [
        ("bad YAML", "domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute,"
                     " requests_per_unit: 9\n"),
        ("an unknown key", config(9, "      burst: 2\n")),
        ("a bad unit", config(9).replace("unit: minute", "unit: fortnight")),
    ]
    for i, (what, text) in enumerate(broken):
        errors_before = reloads("error")
        write_atomically(path, text)
        wait_until(f"the refusal of {what} to be counted", lambda: reloads("error") > errors_before)
        c.eq(reloads("error"), errors_before + 1, f"{what}: one refusal counted")
        c.eq(limit_now(), (7, Unit.MINUTE), f"{what}: the limit in force")
        r = svc.ask("messaging", desc(("to_number", "2067777777")))
        expect_status(c, r.statuses[0], f"{what}: another file of the directory", OK,
                      (100, Unit.DAY), 98 - i)

    # A second file naming the same domain is refused as a whole too.
    write_atomically(path, config(11))
    wait_until("the repaired file (11) to answer", lambda: limit_now() == (11, Unit.MINUTE))
    dup = os.path.join(env["config_dir"], "zz_duplicate.yaml")
    errors_before = reloads("error")
    write_atomically(dup, config(13))
    wait_until("the refusal of a duplicate domain to be counted",
               lambda: reloads("error") > errors_before)
    c.eq(limit_now(), (11, Unit.MINUTE), "a duplicate domain: the limit in force")
    os.remove(dup)

    # A file added to the directory brings its domain; removed, the domain is gone.
    added = os.path.join(env["config_dir"], "added.yaml")
    write_atomically(
        added,
        "domain: added\ndescriptors:\n"
        "  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 4}\n",
    )
    wait_until("the added file's domain to answer",
               lambda: limit_of(svc.ask("added", probe).statuses[0]) == (4, Unit.HOUR))
    c.eq(limit_now(), (11, Unit.MINUTE), "the other files with the added one")
    os.remove(added)
    wait_until("the removed file's domain to go",
               lambda: limit_of(svc.ask("added", probe).statuses[0]) is None)
    c.eq(limit_now(), (11, Unit.MINUTE), "the other files without the removed one")


@case("8 bad requests are refused with INVALID_ARGUMENT, and the node goes on serving")
def bad_requests(c, svc, clock, env):
    good = ("edge_proxy_per_ip", desc(("remote_address", "10.8.0.1"), hits=0))

    def still_serving(what):
        try:
            r = svc.ask(*good)
            expect_status(c, r.statuses[0], f"a normal request after {what}", OK,
                          (10, Unit.SECOND))
        except grpc.RpcError as e:
            c.true(False, f"a normal request after {what} failed: {e.code()} {e.details()}")

    def invalid(what, domain, descriptors, mentions):
        e = svc.refused(c, what, domain, *descriptors)
        if e is not None:
            c.eq(e.code(), grpc.StatusCode.INVALID_ARGUMENT, f"{what}: status code")
            details = e.details() or ""
            c.true(all(m in details for m in mentions),
                   f"{what}: the message should mention {mentions}, got {details!r}")
            print(f"    {what}: {e.code().name}: {details}")
        still_serving(what)

    invalid("an empty domain", "", [desc(("k", "v"))], ["domain"])
    invalid("no descriptors", "edge_proxy_per_ip", [], ["descriptor"])
    invalid("10,000 descriptors", "edge_proxy_per_ip",
            [desc(("remote_address", f"10.8.{i // 256}.{i % 256}")) for i in range(10_000)],
            ["10000", "descriptors"])
    invalid("a descriptor with no entries", "edge_proxy_per_ip",
            [desc(("remote_address", "10.8.0.2")), ratelimit_pb2.RateLimitDescriptor()],
            ["entries"])
    invalid("a descriptor of 33 entries", "edge_proxy_per_ip",
            [desc(*[(f"k{i}", "v") for i in range(33)])], ["entries"])
    invalid("100 KiB of keys and values", "edge_proxy_per_ip",
            [desc(("remote_address", "x" * (100 * 1024)))], ["bytes"])

    # Larger than the node takes: refused by the transport before it is read.
    what = "a message over 1 MiB"
    e = svc.refused(c, what, "edge_proxy_per_ip",
                    desc(("remote_address", "x" * (1024 * 1024 + 1))))
    if e is not None:
        c.true(e.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.OUT_OF_RANGE),
               f"{what}: expected RESOURCE_EXHAUSTED or OUT_OF_RANGE, got {e.code().name}")
        print(f"    {what}: {e.code().name}: {e.details()}")
    still_serving(what)
    try:
        fresh = svc.open()
        r = svc.ask(*good, channel=fresh)
        c.eq(r.overall_code, OK, f"a new connection after {what}: overall code")
        fresh.close()
    except grpc.RpcError as e:
        c.true(False, f"a new connection after {what} failed: {e.code()} {e.details()}")


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    grpc_port, metrics_port, config_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    env = {"metrics_port": metrics_port, "config_dir": config_dir}
    clock = Clock(int(os.environ.get("RLS_TEST_CLOCK_MS", "1700000000000")))
    svc = Service(grpc_port)
    failed = []
    for name, f in CASES:
        c = Case(name)
        try:
            f(c, svc, clock, env)
        except Failed as e:
            if e.args:
                c.failures.append(str(e.args[0]))
        except grpc.RpcError as e:
            c.failures.append(f"unexpected gRPC error: {e.code()} {e.details()}")
        except Exception:
            c.failures.append("raised:\n" + traceback.format_exc())
        if c.failures:
            failed.append(name)
            print(f"FAIL {name}")
            for m in c.failures:
                print(f"    - {m}")
        else:
            print(f"PASS {name}")
    print(f"{len(CASES) - len(failed)} of {len(CASES)} cases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
