#!/usr/bin/python3
"""Plots summa-bench-scale's table: step time against workers, next to the parameter-server model.

Reads the tab-separated data the driver writes (workers, shards, model_bytes, step_ms, model_ms,
reference_ms; empty cells where unknown) and writes a PNG. Needs matplotlib (Debian:
python3-matplotlib); without it, says so and exits with status 3.

  /usr/bin/python3 bench/scale_plot.py --data=scale.tsv --out=bench/scale.png --title='...'
"""
import argparse
import csv
import sys


def column(rows, name):
    return [float(r[name]) if r[name] else None for r in rows]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="the driver's tab-separated table")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--title", default="summa-server scaling")
    parser.add_argument("--reference_label", default="",
                        help="name of the reference bandwidth, when the data has a reference_ms column filled")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("scale_plot.py: matplotlib is not installed (apt-get install python3-matplotlib)",
              file=sys.stderr)
        return 3

    with open(args.data, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        print(f"scale_plot.py: {args.data} has no rows", file=sys.stderr)
        return 1
    workers = sorted({int(r["workers"]) for r in rows})
    shard_counts = sorted({int(r["shards"]) for r in rows})

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)

    def plot(rows_of_k, values, label, **style):
        points = [(int(r["workers"]), v) for r, v in zip(rows_of_k, values) if v is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], label=label, **style)

    for k in shard_counts:
        of_k = [r for r in rows if int(r["shards"]) == k]
        plot(of_k, column(of_k, "step_ms"), f"summa, k = {k}: measured step (median of slowest worker)",
             marker="o", linewidth=2)
        plot(of_k, column(of_k, "model_ms"), f"PS model max(M/B, NM/kB), k = {k}, B fitted to 1 worker",
             linestyle="--", marker="x")
        plot(of_k, column(of_k, "reference_ms"),
             f"PS model, k = {k}, B = {args.reference_label}" if args.reference_label
             else f"PS model, k = {k}, reference B",
             linestyle=":", marker="+")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(workers)
    ax.set_xticklabels([str(n) for n in workers])
    ax.set_xlabel("workers N (k server shards)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(args.title)
    ax.grid(True, which="both", alpha=0.3)
    # Below the axes: the lines cross the whole plot.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.14))
    fig.tight_layout()
    fig.savefig(args.out, bbox_inches="tight")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
