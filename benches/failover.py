#!/usr/bin/env python3
"""Failover of a 3-node bucketd cluster, measured from outside with real processes.

usage (as root: it runs the nodes under their own uids and installs nftables rules):
  python3 benches/failover.py [--bin target/release/bucketd] [--runs 3]
                              [--scenarios kill,stop,partition] [--port 26101]

Node i listens for clients on 127.0.0.i:PORT and for peers on 127.0.0.i:PORT+1000+i. A client
sends `INCR key` every 2 ms to the leader of the key's group (node X), follows -MOVED, and on
errors or broken connections tries the other nodes. Each scenario runs on a fresh cluster:
  kill       kill -9 of X
  stop       SIGSTOP of X; at the end SIGCONT, then INCR sent to X directly must answer MOVED
             or a value above every acknowledged one (never a stale success)
  partition  all peer traffic between X and the other two nodes dropped, both directions,
             with nftables in the table `inet bucketd_failover`; client traffic to X is left
             alone, so X's own CLUSTER SLOTS is polled every 20 ms to see when it stops
             claiming its groups. The table is deleted afterwards, also on failure or Ctrl-C.

The cut is made per process: every node runs under a uid of its own, a packet that X's
sockets send (other than its client replies) marks its connection in conntrack, and marked
connections are dropped in both directions, as are connections to X's peer port. (Outgoing peer
connections also leave from the node's own address, so a cut by address works as well.)

Reported per run: the failover gap (longest time between two successful replies from 1 s before
the fault on), the error kinds seen in that gap, and the final counter against the number of
acknowledged INCRs and against acknowledged + ambiguous (TRYAGAIN, timeout, connection lost
after sending: the INCR may or may not have been applied). CLUSTERDOWN is taken as not applied.
"""

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from resp import Resp, is_err

NFT_TABLE = "bucketd_failover"
UID_BASE = 61000
REQ_TIMEOUT_S = 0.3
INTERVAL_S = 0.002
CT_MARK = "0x4242"


def ask(host, port, *args, timeout=1.0):
    c = Resp(host, port, timeout)
    try:
        return c.command(*args)
    finally:
        c.close()



def nft(script):
    subprocess.run(["nft", "-f", "-"], input=script.encode(), check=True)


def nft_delete_table():
    subprocess.run(
        ["nft", "delete", "table", "inet", NFT_TABLE],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class Cluster:
    def __init__(self, bin_path, port, root):
        self.bin = bin_path
        self.port = port
        self.root = root
        self.procs = {}
        self.stopped = set()
        self.addr = {i: f"127.0.0.{i}" for i in (1, 2, 3)}
        self.peer_port = {i: port + 1000 + i for i in (1, 2, 3)}
        self.uid = {i: UID_BASE + i for i in (1, 2, 3)}

    def start(self):
        nodes = ",".join(f"{i}:{self.addr[i]}:{self.port}:{self.peer_port[i]}" for i in (1, 2, 3))
        for i in (1, 2, 3):
            d = os.path.join(self.root, f"node-{i}")
            os.makedirs(d)
            os.chown(d, self.uid[i], self.uid[i])
            log = open(os.path.join(self.root, f"node-{i}.log"), "wb")
            self.procs[i] = subprocess.Popen(
                [self.bin, "--bind", self.addr[i], "--port", str(self.port), "--shards", "1",
                 "--cluster-nodes", nodes, "--node-id", str(i), "--groups", "16",
                 "--data-dir", d],
                stdout=log, stderr=subprocess.STDOUT, user=self.uid[i], group=self.uid[i],
                start_new_session=True,
            )
            log.close()

    def wait_settled(self, limit_s=30):
        """Until every node says cluster_state:ok and each leads 5 or 6 groups, for 1 s."""
        deadline = time.monotonic() + limit_s
        good_since = None
        while time.monotonic() < deadline:
            ok = True
            try:
                for i in (1, 2, 3):
                    info = ask(self.addr[i], self.port, "CLUSTER", "INFO")
                    if is_err(info) or "cluster_state:ok" not in info:
                        ok = False
                        break
                    counts = self.leader_counts(i)
                    if sorted(counts.values()) not in ([5, 5, 6],) or len(counts) != 3:
                        ok = False
                        break
            except OSError:
                ok = False
            if ok:
                good_since = good_since or time.monotonic()
                if time.monotonic() - good_since >= 1.0:
                    return
            else:
                good_since = None
            time.sleep(0.1)
        raise RuntimeError("cluster did not settle within %d s" % limit_s)

    def leader_counts(self, i):
        nodes = ask(self.addr[i], self.port, "CLUSTER", "NODES")
        counts = {}
        for line in nodes.splitlines():
            f = line.split()
            if len(f) >= 8 and "master" in f[2]:
                counts[f[1].split("@")[0]] = len(f) - 8
        return counts

    def signal(self, i, sig):
        if self.procs[i].poll() is None:
            os.kill(self.procs[i].pid, sig)

    def stop(self):
        for i, p in self.procs.items():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def slot_leaders(host, port):
    """[(start, end, leader client address)] from one node's CLUSTER SLOTS."""
    r = ask(host, port, "CLUSTER", "SLOTS", timeout=0.5)
    if is_err(r):
        return []
    return [(e[0], e[1], f"{e[2][0]}:{e[2][1]}") for e in r]


class Client(threading.Thread):
    """INCR key every INTERVAL_S, following MOVED, failing over to other nodes on errors."""

    def __init__(self, cluster, key, start_addr):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.key = key
        self.target = start_addr
        self.conns = {}
        self.stop_flag = threading.Event()
        self.successes = []  # (t, value, addr)
        self.errors = []  # (t, kind, addr)
        self.ambiguous = 0
        self.all_addrs = [f"{cluster.addr[i]}:{cluster.port}" for i in (1, 2, 3)]

    def conn(self, addr):
        c = self.conns.get(addr)
        if c is None:
            h, p = addr.rsplit(":", 1)
            c = Resp(h, int(p), REQ_TIMEOUT_S)
            self.conns[addr] = c
        return c

    def drop(self, addr):
        c = self.conns.pop(addr, None)
        if c:
            c.close()

    def next_addr(self, bad):
        i = self.all_addrs.index(bad) if bad in self.all_addrs else -1
        return self.all_addrs[(i + 1) % len(self.all_addrs)]

    def one(self):
        """One INCR, with up to a few redirects; returns after a success or a failure."""
        for _ in range(5):
            addr = self.target
            sent = False
            try:
                c = self.conn(addr)
                c.send("INCR", self.key)
                sent = True
                r = c.reply()
            except socket.timeout:
                self.drop(addr)
                self.errors.append((time.monotonic(), "timeout" if sent else "connect-timeout", addr))
                if sent:
                    self.ambiguous += 1
                self.target = self.next_addr(addr)
                return
            except OSError as e:
                self.drop(addr)
                kind = ("conn-lost:" if sent else "conn-fail:") + type(e).__name__
                self.errors.append((time.monotonic(), kind, addr))
                if sent:
                    self.ambiguous += 1
                self.target = self.next_addr(addr)
                return
            now = time.monotonic()
            if is_err(r):
                kind = r[1].split()[0]
                self.errors.append((now, kind, addr))
                if kind == "MOVED":
                    self.target = r[1].split()[2]
                    continue
                if kind == "TRYAGAIN":
                    self.ambiguous += 1
                self.target = self.next_addr(addr)
                return
            self.successes.append((now, r, addr))
            return

    def run(self):
        nxt = time.monotonic()
        while not self.stop_flag.is_set():
            self.one()
            nxt += INTERVAL_S
            delay = nxt - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                nxt = time.monotonic()
        for a in list(self.conns):
            self.drop(a)


class SlotPoller(threading.Thread):
    """Polls X's own CLUSTER SLOTS every 20 ms: when did X stop claiming the given ranges?"""

    def __init__(self, host, port, me, ranges):
        super().__init__(daemon=True)
        self.host, self.port, self.me, self.ranges = host, port, me, set(ranges)
        self.stop_flag = threading.Event()
        self.released_at = None
        self.errors = 0

    def run(self):
        while not self.stop_flag.is_set() and self.released_at is None:
            try:
                mine = {(s, e) for s, e, a in slot_leaders(self.host, self.port) if a == self.me}
                if not (mine & self.ranges):
                    self.released_at = time.monotonic()
            except OSError:
                self.errors += 1
            time.sleep(0.02)


def partition_rules(c, x):
    return f"""
table inet {NFT_TABLE} {{
  chain out {{
    type filter hook output priority filter - 5; policy accept;
    ip daddr {c.addr[x]} tcp dport {c.peer_port[x]} drop
    meta skuid {c.uid[x]} ip saddr {c.addr[x]} tcp sport {c.port} accept
    meta skuid {c.uid[x]} ct mark set {CT_MARK}
    ct mark {CT_MARK} drop
  }}
  chain in {{
    type filter hook input priority filter - 5; policy accept;
    ct mark {CT_MARK} drop
    ip daddr {c.addr[x]} tcp dport {c.peer_port[x]} drop
  }}
}}
"""


def final_counter(c, key):
    for _ in range(100):
        for i in (1, 2, 3):
            try:
                r = ask(c.addr[i], c.port, "GET", key, timeout=0.5)
            except OSError:
                continue
            if not is_err(r):
                return int(r or 0)
        time.sleep(0.1)
    return None


def run_scenario(args, scenario, run_no, binary):
    root = tempfile.mkdtemp(prefix="bucketd-failover-")
    os.chmod(root, 0o755)
    c = Cluster(binary, args.port, root)
    res = {"scenario": scenario, "run": run_no}
    client = poller = None
    try:
        c.start()
        c.wait_settled()
        # X cycles over the nodes from run to run; the key is one whose group X leads.
        x = (run_no % 3) + 1
        me = f"{c.addr[x]}:{c.port}"
        leaders = slot_leaders(c.addr[1], c.port)
        mine = [(s, e) for s, e, a in leaders if a == me]
        key = None
        for n in range(100000):
            k = f"fo:{n}"
            slot = ask(c.addr[1], c.port, "CLUSTER", "KEYSLOT", k)
            if any(s <= slot <= e for s, e in mine):
                key = k
                break
        res.update(x=x, key=key)
        client = Client(c, key, me)
        client.start()
        time.sleep(1.0)
        t_fault = time.monotonic()
        if scenario == "kill":
            c.signal(x, signal.SIGKILL)
        elif scenario == "stop":
            c.signal(x, signal.SIGSTOP)
        elif scenario == "partition":
            poller = SlotPoller(c.addr[x], c.port, me, mine)
            nft(partition_rules(c, x))
            t_fault = time.monotonic()
            poller.start()
        time.sleep(args.after)
        client.stop_flag.set()
        client.join(5)
        if poller:
            poller.stop_flag.set()
            poller.join(2)
            res["release_ms"] = (
                None if poller.released_at is None else (poller.released_at - t_fault) * 1000
            )
            # While still cut: X must not have served a success after the cut's lease ran out.
            served_by_x = [t for t, v, a in client.successes if a == me and t > t_fault]
            res["x_success_after_cut_ms"] = (
                (max(served_by_x) - t_fault) * 1000 if served_by_x else None
            )
        # Gap and the errors inside it.
        succ = [t for t, v, a in client.successes if t >= t_fault - 1.0]
        gap, g0, g1 = 0.0, t_fault, t_fault
        for a, b in zip(succ, succ[1:]):
            if b - a > gap:
                gap, g0, g1 = b - a, a, b
        if succ and succ[-1] < t_fault:
            gap, g0, g1 = time.monotonic() - succ[-1], succ[-1], time.monotonic()
        res["gap_ms"] = gap * 1000
        res["gap_start_after_fault_ms"] = (g0 - t_fault) * 1000
        kinds = {}
        for t, k, a in client.errors:
            if g0 < t <= g1:
                kinds[k] = kinds.get(k, 0) + 1
        res["gap_errors"] = kinds
        all_kinds = {}
        for t, k, a in client.errors:
            all_kinds[k] = all_kinds.get(k, 0) + 1
        res["all_errors"] = all_kinds
        vals = [v for t, v, a in client.successes]
        res["monotonic"] = all(b > a for a, b in zip(vals, vals[1:]))
        acked = len(client.successes)
        max_acked = max(vals) if vals else 0
        # Heal, then ask X directly: MOVED or a value above every acknowledged one.
        if scenario in ("stop", "partition"):
            if scenario == "stop":
                c.signal(x, signal.SIGCONT)
            else:
                nft_delete_table()
            direct = []
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                try:
                    r = ask(c.addr[x], c.port, "INCR", key, timeout=1.0)
                except OSError as e:
                    r = ("err", "conn:" + type(e).__name__)
                if isinstance(r, int):
                    acked += 1
                    direct.append(("value", r, r > max_acked))
                    max_acked = max(max_acked, r)
                else:
                    k = r[1].split()[0]
                    direct.append((k,))
                    if k == "TRYAGAIN" or k.startswith("conn"):
                        client.ambiguous += 1
                time.sleep(0.1)
            stale = [d for d in direct if d[0] == "value" and not d[2]]
            res["direct_to_x"] = summarize_direct(direct)
            res["stale_success"] = bool(stale)
        res["acked"] = acked
        res["ambiguous"] = client.ambiguous
        res["counter"] = final_counter(c, key)
        cnt = res["counter"]
        res["no_ack_lost"] = cnt is not None and cnt >= acked
        res["within_ambiguous"] = cnt is not None and acked <= cnt <= acked + client.ambiguous
        return res
    finally:
        if client:
            client.stop_flag.set()
        if poller:
            poller.stop_flag.set()
        nft_delete_table()
        c.stop()
        if args.keep:
            print(f"  logs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


def summarize_direct(direct):
    out = {}
    for d in direct:
        k = d[0] if d[0] != "value" else ("fresh-value" if d[2] else "STALE-value")
        out[k] = out.get(k, 0) + 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "target",
                                                   "release", "bucketd"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scenarios", default="kill,stop,partition")
    ap.add_argument("--port", type=int, default=26101)
    ap.add_argument("--after", type=float, default=5.0, help="seconds of traffic after the fault")
    ap.add_argument("--keep", action="store_true", help="keep data directories and logs")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (per-node uids and nftables)")
    # A private copy, so that a rebuild during the runs does not change the binary under test.
    bindir = tempfile.mkdtemp(prefix="bucketd-failover-bin-")
    os.chmod(bindir, 0o755)
    binary = os.path.join(bindir, "bucketd")
    shutil.copy2(args.bin, binary)
    os.chmod(binary, 0o755)
    results = []
    try:
        for scenario in args.scenarios.split(","):
            for r in range(args.runs):
                res = run_scenario(args, scenario, r, binary)
                results.append(res)
                print(res, flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        nft_delete_table()
        shutil.rmtree(bindir, ignore_errors=True)
        ruleset = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True).stdout
        print("nft ruleset clean of %s: %s" % (NFT_TABLE, NFT_TABLE not in ruleset))
    print()
    print("scenario   runs  gap ms min/median/max        counter==acked  within acked+ambiguous")
    for scenario in args.scenarios.split(","):
        rs = [r for r in results if r["scenario"] == scenario]
        if not rs:
            continue
        gaps = [r["gap_ms"] for r in rs]
        print("%-10s %4d  %6.0f / %6.0f / %6.0f   %d/%d            %d/%d" % (
            scenario, len(rs), min(gaps), statistics.median(gaps), max(gaps),
            sum(r["counter"] == r["acked"] for r in rs), len(rs),
            sum(r["within_ambiguous"] for r in rs), len(rs)))


if __name__ == "__main__":
    main()
