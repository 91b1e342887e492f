#!/usr/bin/env python3
"""How long a 3 -> 4 rebalance takes with many buckets, and what checks see meanwhile.

usage: python3 benches/rebalance.py [--bin target/release/bucketd] [--buckets 1000000]
                                    [--groups 32] [--port 27001] [--probe-threads 4]

Starts three nodes on 127.0.0.1 (clients on PORT..PORT+2, peers 10000 above), fills them with
BUCKETS token buckets spread over every slot (CL.THROTTLE b:N 99 1 3600 1, sent with
`redis-cli --pipe` to the leader of each key's group), then runs probe clients that send one
CL.THROTTLE at a time to a random bucket's leader and follow -MOVED. It records latencies for
STEADY_S seconds of steady state, then starts a fourth node with --join and keeps probing
until BK.CLUSTER STATUS reports 4 members and no move left, and prints:

  the time from the join to the end of the last move,
  p50 / p99 / max latency of the checks in steady state and during the rebalance,
  and every error reply the probes saw (MOVED is followed, not counted as an error).

KEEP=1 keeps the nodes' data folders and logs.
"""

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from cluster_view import maps_of, slot_map
from resp import Resp, is_err


def crc16(data):
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key):
    s = key.find(b"{")
    if s >= 0:
        e = key.find(b"}", s + 1)
        if e > s + 1:
            key = key[s + 1 : e]
    return crc16(key) % 16384


def ask(port, *args, timeout=5.0):
    c = Resp("127.0.0.1", port, timeout)
    try:
        return c.command(*args)
    finally:
        c.close()


def owners(ranges):
    """slot -> client port of the node serving it, from cluster_view's (lo, hi, port) ranges."""
    owner = [None] * 16384
    for lo, hi, port in ranges:
        owner[lo : hi + 1] = [port] * (hi - lo + 1)
    return owner


def slot_owners(port):
    return owners(slot_map("127.0.0.1", port))


def settled_owners(ports, hold_s=3.0, limit_s=90.0):
    """The slot map once every node gives the same one and it has held still for `hold_s`.

    The first elections can hand one node most of the groups, and the balancer then moves
    leaderships one at a time; a fill sent by a map taken meanwhile meets -MOVED.
    """
    deadline = time.time() + limit_s
    last, since = None, time.time()
    while True:
        try:
            maps, agree = maps_of("127.0.0.1", ports)
            current = maps[0] if agree else None
        except RuntimeError:
            current = None
        now = time.time()
        if current is None or current != last:
            last, since = current, now
        elif now - since >= hold_s:
            return owners(last)
        if now > deadline:
            sys.exit(f"the slot map did not hold still for {hold_s} s within {limit_s} s")
        time.sleep(0.2)


def status(port):
    r = ask(port, "BK.CLUSTER", "STATUS")
    kv = dict(zip(r[0::2], r[1::2]))
    members = []
    for m in kv["members"]:
        members.append(dict(zip(m[0::2], m[1::2])))
    return kv, members


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


class Probe(threading.Thread):
    def __init__(self, ports, buckets, stop):
        super().__init__(daemon=True)
        self.ports = ports
        self.buckets = buckets
        self.stop = stop
        self.samples = []  # (time sent, latency s)
        self.errors = []
        self.conns = {}
        self.owner = slot_owners(ports[0])

    def conn(self, port):
        c = self.conns.get(port)
        if c is None:
            c = Resp("127.0.0.1", port, 5.0)
            self.conns[port] = c
        return c

    def run(self):
        rnd = random.Random(threading.get_ident())
        while not self.stop.is_set():
            key = b"b:%d" % rnd.randrange(self.buckets)
            slot = key_slot(key)
            port = self.owner[slot] or self.ports[0]
            t0 = time.monotonic()
            for _ in range(10):
                try:
                    r = self.conn(port).command("CL.THROTTLE", key, "99", "1", "3600", "0")
                except OSError as e:
                    self.conns.pop(port, None)
                    self.errors.append(f"{port}: {e}")
                    port = rnd.choice(self.ports)
                    continue
                if is_err(r) and r[1].startswith("MOVED"):
                    port = int(r[1].split(":")[-1])
                    self.owner[slot] = port
                    continue
                if is_err(r):
                    self.errors.append(r[1])
                    time.sleep(0.01)
                    continue
                break
            self.samples.append((t0, time.monotonic() - t0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/bucketd")
    ap.add_argument("--buckets", type=int, default=1_000_000)
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--port", type=int, default=27001)
    ap.add_argument("--probe-threads", type=int, default=4)
    ap.add_argument("--steady-s", type=float, default=10.0)
    args = ap.parse_args()

    root = tempfile.mkdtemp(prefix="bucketd-rebalance-")
    ports = [args.port + i for i in range(4)]
    peers = [p + 10000 for p in ports]
    nodes = ",".join(f"{i + 1}:127.0.0.1:{ports[i]}:{peers[i]}" for i in range(3))
    procs = []

    def spawn(extra, i):
        log = open(os.path.join(root, f"node-{i + 1}.log"), "w")
        cmd = [args.bin, "--bind", "127.0.0.1", "--port", str(ports[i]), "--shards", "1"]
        cmd += ["--data-dir", os.path.join(root, f"node-{i + 1}"), "--log", "warn"] + extra
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=log))

    try:
        for i in range(3):
            spawn(["--cluster-nodes", nodes, "--node-id", str(i + 1), "--groups", str(args.groups)], i)
        deadline = time.time() + 30
        while True:
            try:
                info = ask(ports[0], "CLUSTER", "INFO")
                if "cluster_state:ok" in info and status(ports[0])[0]["nodes"] == 3:
                    break
            except (OSError, KeyError):
                pass
            if time.time() > deadline:
                sys.exit("the cluster did not come up")
            time.sleep(0.2)
        owner = settled_owners(ports[:3])

        # Fill: one RESP stream per leader.
        t0 = time.time()
        files = {p: open(os.path.join(root, f"fill-{p}.resp"), "wb") for p in ports[:3]}
        for n in range(args.buckets):
            key = b"b:%d" % n
            files[owner[key_slot(key)]].write(
                b"*6\r\n$11\r\nCL.THROTTLE\r\n$%d\r\n%s\r\n$2\r\n99\r\n$1\r\n1\r\n$4\r\n3600\r\n$1\r\n1\r\n"
                % (len(key), key)
            )
        for f in files.values():
            f.close()
        for p in ports[:3]:
            with open(os.path.join(root, f"fill-{p}.resp"), "rb") as f:
                out = subprocess.run(
                    ["redis-cli", "-p", str(p), "--pipe"], stdin=f, capture_output=True, text=True
                )
            print(f"fill {p}: {out.stdout.strip().splitlines()[-1] if out.stdout else out.stderr}")
        filled = time.time() - t0
        # A follower applies an entry once it learns of its commit, with the leader's next
        # append or heartbeat: the last few entries reach the followers' stores a moment later.
        settle = time.time() + 2
        while True:
            keys = sum(int(ask(p, "DBSIZE")) for p in ports[:3])
            if keys >= 3 * args.buckets or time.time() > settle:
                break
            time.sleep(0.05)
        print(f"filled {args.buckets} buckets in {filled:.1f} s (DBSIZE summed over the 3 nodes: {keys}, 3 replicas each)")

        stop = threading.Event()
        probes = [Probe(ports[:3], args.buckets, stop) for _ in range(args.probe_threads)]
        for p in probes:
            p.start()
        time.sleep(args.steady_s)
        join_at = time.monotonic()
        spawn(["--join", f"127.0.0.1:{ports[0]}", "--peer-port", str(peers[3])], 3)
        for p in probes:
            p.ports = ports
        done_at = None
        deadline = time.time() + 900
        while time.time() < deadline:
            try:
                kv, members = status(ports[0])
                if kv["nodes"] == 4 and kv["moves_in_progress"] == 0 and all(
                    m["state"] == "up" for m in members
                ):
                    done_at = time.monotonic()
                    break
            except (OSError, KeyError):
                pass
            time.sleep(0.05)
        time.sleep(1)
        stop.set()
        for p in probes:
            p.join(10)
        if done_at is None:
            sys.exit("the rebalance did not finish within 900 s")
        steady = [l for p in probes for (t, l) in p.samples if t < join_at]
        during = [l for p in probes for (t, l) in p.samples if join_at <= t <= done_at]
        errors = [e for p in probes for e in p.errors]
        kv, members = status(ports[0])
        print(f"rebalance 3 -> 4 with {args.buckets} buckets, {args.groups} groups: {done_at - join_at:.1f} s")
        for name, xs in (("steady state", steady), ("during the rebalance", during)):
            print(
                f"  {name}: {len(xs)} checks, p50 {pct(xs, 0.5) * 1000:.2f} ms, "
                f"p99 {pct(xs, 0.99) * 1000:.2f} ms, max {max(xs) * 1000 if xs else 0:.1f} ms"
            )
        print("  members: " + ", ".join(
            f"{m['id']}: {m['replicas']} replicas, {m['leaders']} leaders" for m in members
        ))
        print(f"  error replies seen by the probes: {len(errors)}")
        for e in sorted(set(errors))[:10]:
            print(f"    {e}")
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        if os.environ.get("KEEP"):
            print("kept the nodes' folders and logs in", root)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
