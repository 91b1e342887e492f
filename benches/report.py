#!/usr/bin/env python3
"""Helpers for compare.sh: parse redis-benchmark output and print markdown tables of medians.

usage:
  report.py parse-csv < benchmark.csv
      prints "rps<TAB>p50_ms<TAB>p99_ms" from redis-benchmark --csv output ("NA" for a missing
      figure: redis-benchmark before 7.0 prints no latency columns).
  report.py pairs RUNS.tsv A_NAME B_NAME ROW [ROW ...]
      RUNS.tsv lines: id, pipeline, round, rps, p50_ms, p99_ms, server_process_cpu_pct,
      server_core_busy_pct, client_core_busy_pct, started_busy (0/1) and optionally
      server_cpu_ns_per_request.
      ROW is "title|a_id|b_id"; one table line per ROW and pipeline, comparing the medians of
      the runs of a_id (side A) and b_id (side B). The ratios are B / A.
  report.py cpu-ratios RUNS.tsv BASE COL [COL ...]
      BASE and COL are "title|id"; one table line per COL (BASE first), with its median server
      CPU ns per request at each pipeline and its ratio to BASE's.
  report.py columns RUNS.tsv COL [COL ...]
      COL is "title|id"; one table line per pipeline, with the median ops/s, p50 and p99 of
      each COL's runs side by side.
  report.py cpu-columns RUNS.tsv COL [COL ...]
      the same layout, with the median server process CPU and server / client core busy %.
  report.py ratio RUNS.tsv NUM_ID DEN_ID PIPELINE
      prints the ratio of the median ops/s of NUM_ID's runs to DEN_ID's at that pipeline.
  report.py rls RUNS.tsv
      RUNS.tsv lines (benches/rls.sh): id (grpc:CONNECTIONS or resp:CONNECTIONS),
      descriptors, round, calls/s, p50_ms, p99_ms, server_cpu_us_per_call,
      server_core_busy_pct, client_core_busy_pct, started_busy (0/1). One table line per
      descriptor count and RESP id, next to the gRPC runs: the medians of each and the ratios
      gRPC / RESP of calls/s and of CPU per call.
"""

import csv
import statistics
import sys


def parse_csv():
    rows = [r for r in csv.reader(sys.stdin) if r]
    header = None
    data = None
    for r in rows:
        if r[0] == "test":
            header = r
        elif header is not None:
            data = r
    if header is None or data is None:
        sys.exit("parse-csv: no redis-benchmark CSV data found")
    cols = dict(zip(header, data))

    def num(name):
        try:
            v = float(cols.get(name, ""))
        except ValueError:
            return "NA"
        return repr(v)

    print(f"{num('rps')}\t{num('p50_latency_ms')}\t{num('p99_latency_ms')}")


def load_runs(path):
    runs = {}
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) not in (10, 11):
                continue
            rid, pipe = parts[0], parts[1]
            values = []
            for v in parts[3:]:
                try:
                    values.append(float(v))
                except ValueError:
                    values.append(None)
            if len(values) == 7:
                values.append(None)
            runs.setdefault((rid, pipe), []).append(values)
    return runs


def ns(samples):
    m = median_of(samples, 7)
    return "n/a" if m is None else f"{m:,.0f}"


def median_of(samples, i):
    vals = [s[i] for s in samples if s[i] is not None]
    return statistics.median(vals) if vals else None


def spread(samples):
    """Largest distance of a run's ops/s from the median, in percent of the median."""
    vals = [s[0] for s in samples if s[0] is not None]
    if len(vals) < 2:
        return ""
    m = statistics.median(vals)
    if m <= 0:
        return ""
    return f" ±{max(abs(v - m) for v in vals) / m * 100:.0f}%"


def ops(samples):
    m = median_of(samples, 0)
    if m is None:
        return "n/a"
    return f"{m:,.0f}{spread(samples)}"


def lat(samples):
    p50, p99 = median_of(samples, 1), median_of(samples, 2)
    if p50 is None or p99 is None:
        return "n/a"
    return f"{p50:.3f} / {p99:.3f}"


def cpu(samples):
    """Median busy % of the server's core and of the client's core."""
    srv, cl = median_of(samples, 4), median_of(samples, 5)
    if srv is None or cl is None:
        return "n/a"
    return f"{srv:.0f}% / {cl:.0f}%"


def pairs(path, a_name, b_name, rows):
    runs = load_runs(path)
    pipes = sorted({p for (_, p) in runs}, key=int)
    print(
        f"| test | pipeline | {a_name} ops/s (median) | {b_name} ops/s (median) | ratio "
        f"{b_name}/{a_name} | {a_name} p50/p99 ms | {b_name} p50/p99 ms | "
        f"{a_name} CPU ns/req | {b_name} CPU ns/req | CPU {b_name}/{a_name} | "
        f"{a_name} busy server / client core | {b_name} busy server / client core |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        title, a_id, b_id = row.split("|")
        for p in pipes:
            a = runs.get((a_id, p))
            b = runs.get((b_id, p))
            if not a or not b:
                continue
            ma, mb = median_of(a, 0), median_of(b, 0)
            ratio = f"{mb / ma:.2f}x" if ma and mb else "n/a"
            na, nb = median_of(a, 7), median_of(b, 7)
            cpu_ratio = f"{nb / na:.2f}x" if na and nb else "n/a"
            print(
                f"| {title} | {p} | {ops(a)} | {ops(b)} | {ratio} | {lat(a)} | {lat(b)} | "
                f"{ns(a)} | {ns(b)} | {cpu_ratio} | {cpu(a)} | {cpu(b)} |"
            )


def cpu_ratios(path, base, cols):
    base_title, base_id = base.split("|")
    runs = load_runs(path)
    pipes = sorted({p for (_, p) in runs}, key=int)
    head = ["request"]
    for p in pipes:
        head += [f"P{p} CPU ns/req", f"P{p} / {base_title}"]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for col in [base] + cols:
        title, rid = col.split("|")
        cells = [title]
        for p in pipes:
            samples = runs.get((rid, p))
            base = runs.get((base_id, p))
            m = median_of(samples, 7) if samples else None
            b = median_of(base, 7) if base else None
            cells.append("n/a" if m is None else f"{m:,.0f}")
            cells.append(f"{m / b:.2f}x" if m and b else "n/a")
        print("| " + " | ".join(cells) + " |")


def columns(path, cols, cpu_view):
    runs = load_runs(path)
    pipes = sorted({p for (_, p) in runs}, key=int)
    parsed = [c.split("|") for c in cols]
    if cpu_view:
        fields = ["processes CPU", "server core busy", "client core busy"]
    else:
        fields = ["ops/s", "p50 ms", "p99 ms"]
    head = ["pipeline"] + [f"{title} {f}" for title, _ in parsed for f in fields]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for p in pipes:
        cells = [p]
        for _, rid in parsed:
            samples = runs.get((rid, p))
            if not samples:
                cells += ["n/a"] * 3
                continue
            if cpu_view:
                for i in (3, 4, 5):
                    m = median_of(samples, i)
                    cells.append("n/a" if m is None else f"{m:.0f}%")
            else:
                p50, p99 = median_of(samples, 1), median_of(samples, 2)
                cells.append(ops(samples))
                cells.append("n/a" if p50 is None else f"{p50:.3f}")
                cells.append("n/a" if p99 is None else f"{p99:.3f}")
        print("| " + " | ".join(cells) + " |")


def ratio(path, num_id, den_id, pipe):
    runs = load_runs(path)
    num, den = runs.get((num_id, pipe)), runs.get((den_id, pipe))
    a = median_of(num, 0) if num else None
    b = median_of(den, 0) if den else None
    print(f"{a / b:.2f}x" if a and b else "n/a")


def rls(path):
    runs = {}
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 10:
                continue
            try:
                values = [float(v) for v in parts[3:]]
            except ValueError:
                continue
            runs.setdefault((parts[0], parts[1]), []).append(values)

    def conns(rid):
        return int(rid.split(":")[1])

    grpc_ids = sorted({r for (r, _) in runs if r.startswith("grpc:")}, key=conns)
    resp_ids = sorted({r for (r, _) in runs if r.startswith("resp:")}, key=conns, reverse=True)
    descs = sorted({d for (_, d) in runs}, key=int)
    print(
        "| descriptors | connections gRPC / RESP | RESP calls/s | gRPC calls/s | gRPC / RESP | "
        "RESP p50 / p99 ms | gRPC p50 / p99 ms | RESP CPU us/call | gRPC CPU us/call | "
        "gRPC / RESP CPU | RESP busy server / client core | gRPC busy server / client core |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d in descs:
        for gid in grpc_ids:
            for rid in resp_ids:
                r, g = runs.get((rid, d)), runs.get((gid, d))
                if not r or not g:
                    continue
                rate = f"{median_of(g, 0) / median_of(r, 0):.2f}x"
                cr, cg = median_of(r, 3), median_of(g, 3)
                cpu_ratio = f"{cg / cr:.2f}x" if cr else "n/a"
                print(
                    f"| {d} | {conns(gid)} / {conns(rid)} | {ops(r)} | {ops(g)} | {rate} | "
                    f"{lat(r)} | {lat(g)} | {cr:.2f} | {cg:.2f} | {cpu_ratio} | {cpu(r)} | "
                    f"{cpu(g)} |"
                )


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "parse-csv":
        parse_csv()
    elif len(sys.argv) >= 6 and sys.argv[1] == "pairs":
        pairs(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    elif len(sys.argv) >= 4 and sys.argv[1] in ("columns", "cpu-columns"):
        columns(sys.argv[2], sys.argv[3:], sys.argv[1] == "cpu-columns")
    elif len(sys.argv) >= 4 and sys.argv[1] == "cpu-ratios":
        cpu_ratios(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif len(sys.argv) == 3 and sys.argv[1] == "rls":
        rls(sys.argv[2])
    elif len(sys.argv) == 6 and sys.argv[1] == "ratio":
        ratio(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
