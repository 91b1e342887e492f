#!/usr/bin/env python3
"""Helpers for compare.sh: parse redis-benchmark output and print markdown tables of medians.

usage:
  report.py parse-csv < benchmark.csv
      prints "rps<TAB>p50_ms<TAB>p99_ms" from redis-benchmark --csv output ("NA" for a missing
      figure: redis-benchmark before 7.0 prints no latency columns).
  report.py pairs RUNS.tsv A_NAME B_NAME ROW [ROW ...]
      RUNS.tsv lines: id, pipeline, round, rps, p50_ms, p99_ms, server_process_cpu_pct,
      server_core_busy_pct, client_core_busy_pct, started_busy (0/1).
      ROW is "title|a_id|b_id"; one table line per ROW and pipeline, comparing the medians of
      the runs of a_id (side A) and b_id (side B). The ratio is B / A.
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
            if len(parts) != 10:
                continue
            rid, pipe = parts[0], parts[1]
            values = []
            for v in parts[3:]:
                try:
                    values.append(float(v))
                except ValueError:
                    values.append(None)
            runs.setdefault((rid, pipe), []).append(values)
    return runs


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
        f"{a_name} busy server / client core | {b_name} busy server / client core |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        title, a_id, b_id = row.split("|")
        for p in pipes:
            a = runs.get((a_id, p))
            b = runs.get((b_id, p))
            if not a or not b:
                continue
            ma, mb = median_of(a, 0), median_of(b, 0)
            ratio = f"{mb / ma:.2f}x" if ma and mb else "n/a"
            print(
                f"| {title} | {p} | {ops(a)} | {ops(b)} | {ratio} | {lat(a)} | {lat(b)} | "
                f"{cpu(a)} | {cpu(b)} |"
            )


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "parse-csv":
        parse_csv()
    elif len(sys.argv) >= 6 and sys.argv[1] == "pairs":
        pairs(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
