#!/usr/bin/env python3
"""What a cluster's nodes say about its slots, for compare.sh's cluster mode.

usage:
  cluster_view.py slots HOST PORT [PORT ...]
      asks every node for CLUSTER SLOTS and prints one line:
        "covered=N agree=0|1 primaries=PORT:SLOTS,PORT:SLOTS,... map=DIGEST"
      covered: slots (of 16384) that the first node's map assigns, counted once each;
      agree: every node returned the same map of slot ranges to primaries;
      primaries: slots served per primary (client port) in the first node's map;
      map: a digest of that map, equal for equal maps.
      Exits 1 unless covered=16384 and agree=1.
  cluster_view.py targets HOST PORT
      prints, for every primary that CLUSTER NODES lists with slots, "PORT FIRST_SLOT": the
      slot whose hash tag redis-benchmark --cluster (before 7.4) puts in every key it sends to
      that primary.
"""

import hashlib
import socket
import sys

TIMEOUT_S = 5


class Resp:
    """A blocking RESP2 connection, enough for CLUSTER SLOTS and CLUSTER NODES."""

    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT_S)
        self.buf = b""

    def close(self):
        self.sock.close()

    def command(self, *args):
        out = [f"*{len(args)}\r\n".encode()]
        for a in args:
            b = a.encode()
            out.append(f"${len(b)}\r\n".encode() + b + b"\r\n")
        self.sock.sendall(b"".join(out))
        return self.reply()

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exact(self, n):
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2 :]
        return data

    def reply(self):
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.exact(n).decode()
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RuntimeError(f"unexpected reply {line!r}")


def ask(host, port, *args):
    conn = Resp(host, port)
    try:
        return conn.command(*args)
    finally:
        conn.close()


def slot_map(host, port):
    """Sorted (lo, hi, primary client port) for every range in CLUSTER SLOTS."""
    ranges = []
    for entry in ask(host, port, "CLUSTER", "SLOTS"):
        lo, hi, primary = entry[0], entry[1], entry[2]
        ranges.append((int(lo), int(hi), int(primary[1])))
    return sorted(ranges)


def slots(host, ports):
    maps = []
    for p in ports:
        try:
            maps.append(slot_map(host, p))
        except (OSError, RuntimeError) as e:
            print(f"covered=0 agree=0 primaries= error={p}:{e}")
            return 1
    first = maps[0]
    covered = set()
    per_primary = {}
    for lo, hi, primary in first:
        covered.update(range(lo, hi + 1))
        per_primary[primary] = per_primary.get(primary, 0) + hi - lo + 1
    agree = all(m == first for m in maps)
    n = len(covered & set(range(16384)))
    shares = ",".join(f"{p}:{c}" for p, c in sorted(per_primary.items()))
    digest = hashlib.sha1(repr(first).encode()).hexdigest()[:12]
    print(f"covered={n} agree={int(agree)} primaries={shares} map={digest}")
    return 0 if n == 16384 and agree else 1


def targets(host, port):
    text = ask(host, port, "CLUSTER", "NODES")
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        flags, master_of = fields[2], fields[3]
        if "slave" in flags or master_of != "-" or len(fields) == 8:
            continue
        addr = fields[1].split("@")[0]
        first = fields[8].lstrip("[").split("-")[0]
        print(f"{addr.rsplit(':', 1)[1]} {first}")
    return 0


def main():
    args = sys.argv[1:]
    if len(args) >= 3 and args[0] == "slots":
        return slots(args[1], [int(p) for p in args[2:]])
    if len(args) == 3 and args[0] == "targets":
        return targets(args[1], int(args[2]))
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
