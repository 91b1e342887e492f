"""Limiter scripts through redis-py as gateways load them (register_script, and EVALSHA after
SCRIPT LOAD), against a bucketd node and a real Redis side by side: the same calls must get the
same replies, and clients racing on one bucket never get more than it holds.

usage: scripts.py BUCKETD_PORT REDIS_PORT [--cluster]

With --cluster, BUCKETD_PORT is one node of a bucketd cluster, reached through redis-py's
cluster client (RedisCluster), which routes each call to the leader of its key's slot.
"""

import os
import sys
import threading

import redis
from redis.cluster import RedisCluster

CLUSTER = "--cluster" in sys.argv[3:]


def bucketd():
    port = int(sys.argv[1])
    if CLUSTER:
        return RedisCluster(host="127.0.0.1", port=port, socket_timeout=10)
    return redis.Redis(port=port, socket_timeout=10)

# The token bucket of docs/migrating-from-redis.md, reading the time with TIME (shared with the
# cluster tests).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "token_bucket.lua")) as f:
    TOKEN_BUCKET = f.read()

# The same bucket with the caller's clock: `now_ms` is ARGV[4].
TOKEN_BUCKET_NOW = TOKEN_BUCKET.replace(
    "local t = redis.call('TIME')\nlocal now = t[1] * 1000 + math.floor(t[2] / 1000)\n",
    "local now = tonumber(ARGV[4])\n",
)
assert "ARGV[4]" in TOKEN_BUCKET_NOW, "the now_ms variant must replace the TIME lines"

FIXED_WINDOW = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if n > tonumber(ARGV[1]) then return {0, n} end
return {1, n}
"""

failures = []


def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name + (f": {detail}" if detail and not ok else ""))
    if not ok:
        failures.append(name)


def main():
    ours = bucketd()
    theirs = redis.Redis(port=int(sys.argv[2]), socket_timeout=10)
    theirs.flushall()
    if not CLUSTER:
        ours.flushall()

    # The caller's clock: identical calls at identical times give identical replies, including
    # the refill between calls.
    calls = [(1_700_000_000_000 + dt, cost) for dt, cost in
             [(0, 1), (0, 3), (10, 4), (20, 5), (120, 1), (1000, 2), (1001, 9), (5000, 1)]]
    replies = {}
    for name, r in (("bucketd", ours), ("redis", theirs)):
        bucket = r.register_script(TOKEN_BUCKET_NOW)
        replies[name] = [bucket(keys=["tb:now"], args=[10, 2, cost, now]) for now, cost in calls]
        replies[name].append(r.hgetall("tb:now"))
    check("token bucket with now_ms: same replies", replies["bucketd"] == replies["redis"],
          f"{replies}")

    # EVALSHA after SCRIPT LOAD, the fixed window.
    seen = {}
    for name, r in (("bucketd", ours), ("redis", theirs)):
        sha = r.script_load(FIXED_WINDOW)
        seen[name] = (sha, [r.evalsha(sha, 1, "fw:k", 3, 60000) for _ in range(5)])
    check("fixed window by EVALSHA: same replies", seen["bucketd"] == seen["redis"], f"{seen}")

    # The TIME version: a burst far faster than the refill (1 per minute) is decided the same.
    burst = {}
    for name, r in (("bucketd", ours), ("redis", theirs)):
        bucket = r.register_script(TOKEN_BUCKET)
        burst[name] = [bucket(keys=["tb:time"], args=[5, 1 / 60, 1])[0] for _ in range(8)]
    check("token bucket with TIME: same decisions", burst["bucketd"] == burst["redis"], f"{burst}")
    check("token bucket with TIME: 5 of 8 admitted", sum(burst["bucketd"]) == 5, f"{burst}")

    # register_script loads the script again when it is not known (after SCRIPT FLUSH). On a
    # cluster redis-py sends SCRIPT FLUSH and SCRIPT LOAD to the nodes it takes for primaries,
    # and it takes only one bucketd node for one (each leads some slot ranges and follows in
    # the others): the script must then run on the keys of every node all the same.
    ours.script_flush()
    keys = ["tb:flushed"]
    if CLUSTER:
        by_node = {}
        for i in range(1000):
            key = f"tb:flushed:{i}"
            node = ours.nodes_manager.get_node_from_slot(ours.keyslot(key)).name
            by_node.setdefault(node, key)
        keys = sorted(by_node.values())
        check("flushed keys cover every node", len(keys) == len(ours.get_nodes()), f"{by_node}")
    bucket = ours.register_script(TOKEN_BUCKET)
    for key in keys:
        first = bucket(keys=[key], args=[3, 1 / 60, 1])
        check(f"register_script after SCRIPT FLUSH ({key})", first == [1, 2], f"{first}")

    # Contention: 8 clients racing on one bucket of 20 with a refill of 1 per minute.
    admitted = []
    lock = threading.Lock()

    def client():
        r = bucketd()
        b = r.register_script(TOKEN_BUCKET)
        n = sum(b(keys=["tb:race"], args=[20, 1 / 60, 1])[0] for _ in range(25))
        with lock:
            admitted.append(n)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    total = sum(admitted)
    check("8 racing clients: no more admitted than the bucket holds",
          len(admitted) == 8 and 20 <= total <= 21, f"admitted {admitted} = {total}")

    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
