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
import sys

from resp import Resp, is_err

TIMEOUT_S = 5


def ask(host, port, *args):
    conn = Resp(host, port, TIMEOUT_S)
    try:
        reply = conn.command(*args)
    finally:
        conn.close()
    if is_err(reply):
        raise RuntimeError(reply[1])
    return reply


def slot_map(host, port):
    """Sorted (lo, hi, primary client port) for every range in CLUSTER SLOTS."""
    ranges = []
    for entry in ask(host, port, "CLUSTER", "SLOTS"):
        lo, hi, primary = entry[0], entry[1], entry[2]
        ranges.append((int(lo), int(hi), int(primary[1])))
    return sorted(ranges)


def maps_of(host, ports):
    """Every node's slot map, and whether they are all the same."""
    maps = []
    for p in ports:
        try:
            maps.append(slot_map(host, p))
        except (OSError, RuntimeError) as e:
            raise RuntimeError(f"{p}:{e}") from e
    return maps, all(m == maps[0] for m in maps)


def slots(host, ports):
    try:
        maps, agree = maps_of(host, ports)
    except RuntimeError as e:
        print(f"covered=0 agree=0 primaries= error={e}")
        return 1
    first = maps[0]
    covered = set()
    per_primary = {}
    for lo, hi, primary in first:
        covered.update(range(lo, hi + 1))
        per_primary[primary] = per_primary.get(primary, 0) + hi - lo + 1
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
