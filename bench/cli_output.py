#!/usr/bin/env python3
"""How fast `simjoin self-join --output` writes each format, and in how much memory.

    python3 bench/cli_output.py [--simjoin target/release/simjoin] [--runs 3]

Workload: the issue-12 one, 1M uniform 2-D float32 points in [0, 1), eps = 0.0032 (16.0M
pairs), CPU backend. For .npy, .csv and .parquet, unsorted and sorted, the median over the
runs of: wall seconds of the whole command, `write_seconds` from --stats (time spent in the
writer and the sort, not waiting for the join), output bytes / write_seconds, and the peak
RSS (the child's ru_maxrss). A count-only run gives the baseline. Needs numpy.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np


def run(cmd, cwd):
    """Wall seconds, peak RSS (bytes) and stdout of one command."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    assert os.waitstatus_to_exitcode(status) == 0, cmd
    return wall, usage.ru_maxrss * 1024, out


def main():
    ap = argparse.ArgumentParser()
    root = Path(__file__).resolve().parent.parent
    ap.add_argument("--simjoin", default=str(root / "target" / "release" / "simjoin"))
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        x = np.random.default_rng(1).random((1_000_000, 2)).astype(np.float32)
        np.save(Path(d) / "x.npy", x)
        base = [args.simjoin, "self-join", "x.npy", "--eps", "0.0032", "--backend", "cpu"]
        walls, peaks = [], []
        for _ in range(args.runs):
            w, p, out = run(base, d)
            walls.append(w)
            peaks.append(p)
        pairs = int(out)
        print(f"{pairs} pairs; count only: {statistics.median(walls):.2f} s wall, "
              f"peak RSS {statistics.median(peaks) / 2**20:.0f} MiB")
        print("| output | wall s | write s | bytes | write GB/s | peak RSS MiB |")
        print("| --- | --- | --- | --- | --- | --- |")
        for ext in ["npy", "csv", "parquet"]:
            for order in [["--unsorted"], []]:
                rows = []
                for _ in range(args.runs):
                    cmd = base + ["--output", f"out.{ext}", "--stats"] + order
                    w, p, out = run(cmd, d)
                    s = json.loads(out)
                    assert s["pairs"] == pairs
                    rows.append((w, s["write_seconds"], s["output_bytes"], p))
                    os.remove(Path(d) / f"out.{ext}")
                wall = statistics.median(r[0] for r in rows)
                write = statistics.median(r[1] for r in rows)
                size = rows[0][2]
                peak = statistics.median(r[3] for r in rows)
                name = f".{ext} {'unsorted' if order else 'sorted'}"
                print(f"| {name} | {wall:.2f} | {write:.3f} | {size} | "
                      f"{size / write / 1e9:.2f} | {peak / 2**20:.0f} |")


if __name__ == "__main__":
    main()
