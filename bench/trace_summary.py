#!/usr/bin/env python3
"""Sums up the timelines of a Summa job (--trace_file of summa-server and summa-worker, or
scripts/launch.sh --trace_dir): for each process, each kind of span (compute, exchange, sum,
optimizer, wait, ...) with its count, median, 90th percentile and total, in milliseconds.

  bench/trace_summary.py /tmp/trace/*.json

"exchange" on a worker is a step's communication as the trainer sees it: push, the wait for the
other workers, and pull (with summa-worker --overlap=true, what is left of it: the wait,
before a step, for the last step's first reply, and "wait", each layer's in the forward); "wait"
on the server is a push-pull parked until its step completed.
Given two or more worker traces, it also prints the communication of each step: the exchange of
the worker that arrived last (the one that waited for nobody), the shortest exchange of the step.
"""
import argparse
import json
import statistics
import sys


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def exchanges(path):
    with open(path) as f:
        events = json.load(f).get("traceEvents", [])
    return [e["dur"] / 1000.0 for e in sorted((e for e in events if e.get("name") == "exchange"), key=lambda e: e["ts"])]


def summarize(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace.get("traceEvents", [])
    process = next((e["args"]["name"] for e in events if e.get("ph") == "M"), path)
    spans = {}
    for e in events:
        if e.get("ph") == "X":
            spans.setdefault(e["name"], []).append(e["dur"] / 1000.0)
    rows = []
    for name in sorted(spans):
        d = spans[name]
        rows.append((process, name, len(d), statistics.median(d), quantile(d, 0.9), sum(d)))
    return rows, trace.get("otherData", {}).get("dropped_events", 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+", help="Chrome trace JSON files written by --trace_file")
    args = parser.parse_args()
    print("Command: " + " ".join(sys.argv))
    print()
    print("| process | span | count | median (ms) | p90 (ms) | total (s) |")
    print("|---|---|---:|---:|---:|---:|")
    for path in args.traces:
        try:
            rows, dropped = summarize(path)
        except (OSError, ValueError, KeyError) as e:
            print(f"trace_summary: {path}: {e}", file=sys.stderr)
            return 1
        for process, name, count, median, p90, total in rows:
            print(f"| {process} | {name} | {count} | {median:.3f} | {p90:.3f} | {total / 1000:.2f} |")
        if dropped:
            print(f"trace_summary: {path}: {dropped} events were dropped (the trace was full)", file=sys.stderr)
    per_worker = [x for x in (exchanges(p) for p in args.traces) if x]
    if len(per_worker) >= 2:
        steps = min(len(x) for x in per_worker)
        last = [min(x[i] for x in per_worker) for i in range(steps)]
        print()
        print(f"communication per step (the last worker's exchange, {steps} steps of {len(per_worker)} workers): "
              f"median {statistics.median(last):.3f} ms, p90 {quantile(last, 0.9):.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
