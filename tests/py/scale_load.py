#!/usr/bin/env python3
"""Load for tests/cluster/scaling.rs: redis-py's RedisCluster, with its default settings, sends
`CL.THROTTLE KEY 99 1 3600 1` over a window of keys that grows with time, until a stop file
appears, a request budget is spent or a deadline passes.

Usage: scale_load.py --port PORT --prefix P --keys N --stop FILE [options]

Key i is `{prefix}{i}`; at `t` seconds after the start, keys 0 .. min(N, first + step * (t //
step_secs)) are in use, so buckets run out all along the run. Prints, at the end, one line per
key used (`count KEY ADMITS REFUSALS`), one per key with writes answered `-UNKNOWN`
(`unknown KEY N`: they may have been applied), up to 20 lines `error SECONDS TEXT`, and one
`total REQUESTS ERRORS` line. Exits 0 however the replies went: judging them is the test's job.
"""

import argparse
import os
import sys
import time

from redis.cluster import RedisCluster


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--keys", type=int, required=True)
    ap.add_argument("--stop", required=True, help="stop once this file exists")
    ap.add_argument("--max-requests", type=int, default=50_000)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--first", type=int, default=20, help="keys in use at the start")
    ap.add_argument("--step", type=int, default=20, help="keys added every step")
    ap.add_argument("--step-secs", type=float, default=4.0)
    ap.add_argument("--pause", type=float, default=0.001, help="seconds between requests")
    ap.add_argument("--offset", type=int, default=0, help="where in the window to start")
    a = ap.parse_args()

    rc = RedisCluster(host=a.host, port=a.port)
    admits = {}
    refusals = {}
    errors = []
    n_errors = 0
    unknown = {}
    requests = 0
    t0 = time.monotonic()
    i = a.offset
    while requests < a.max_requests:
        t = time.monotonic() - t0
        if t > a.max_seconds or (requests % 16 == 0 and os.path.exists(a.stop)):
            break
        window = min(a.keys, a.first + a.step * int(t // a.step_secs))
        key = f"{a.prefix}{i % window}"
        i += 7
        requests += 1
        try:
            r = rc.execute_command("CL.THROTTLE", key, 99, 1, 3600, 1)
            if not (isinstance(r, list) and len(r) == 5):
                raise ValueError(f"unexpected reply {r!r}")
            if r[0] == 0:
                admits[key] = admits.get(key, 0) + 1
            else:
                refusals[key] = refusals.get(key, 0) + 1
        except Exception as e:  # every error the application would see
            if "UNKNOWN" in str(e):
                # The write may have been applied: counted apart, per key.
                unknown[key] = unknown.get(key, 0) + 1
            else:
                n_errors += 1
            if len(errors) < 20 and "UNKNOWN" not in str(e):
                text = f"{type(e).__name__}: {e}".replace("\n", " ")
                errors.append(f"{time.monotonic() - t0:.3f} {key} {text}")
            time.sleep(0.05)
        if a.pause > 0:
            time.sleep(a.pause)

    for key in sorted(set(admits) | set(refusals)):
        print(f"count {key} {admits.get(key, 0)} {refusals.get(key, 0)}")
    for key in sorted(unknown):
        print(f"unknown {key} {unknown[key]}")
    for e in errors:
        print(f"error {e}")
    print(f"total {requests} {n_errors}")
    sys.stdout.flush()
    try:
        rc.close()
    except Exception:
        pass


if __name__ == "__main__":
    main()
