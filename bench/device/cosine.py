"""Issue 40 on a GPU: the grouped cosine join with its tiles on the device (gpu/grouped.rs)
against the same join on simjoin's CPU backend (every core of the machine) and against the
GPU's brute force (`--algorithm brute`: every pair's distance on the device, what a
chunked `X @ X.T` with a threshold does; PyTorch itself cannot be carried to the device
machine), same data, same run, through the CLI with the pairs written sorted to a .npy
file (what a user gets). Data: bench/embed_bench.py's generator (clusters around random
centres, and uniform on the sphere). Prints a Markdown table with ratios; every system's
pair count must agree.

    python3 bench/device/cosine.py --simjoin-bin .device/simjoin --out OUT [--small]
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numpy as np  # noqa: E402

from embed_bench import make  # noqa: E402

# name, n, dim, centres, spread, eps (cosine distance), brute force too
FULL = [
    ("clusters-384d-100k", 100_000, 384, 2000, 0.016, 0.1, True),
    ("clusters-768d-100k", 100_000, 768, 2000, 0.011, 0.1, True),
    ("sphere-384d-100k", 100_000, 384, 0, 0.0, 0.1, True),
    ("dups-384d-100k", 100_000, 384, 2000, 0.03, 0.001, True),
    ("clusters-384d-1m", 1_000_000, 384, 10_000, 0.016, 0.1, False),
]
SMALL = [
    ("clusters-384d-6k", 6_000, 384, 120, 0.016, 0.1, True),
    ("sphere-128d-5k", 5_000, 128, 0, 0.0, 0.1, True),
]


def run(binary, path, eps, backend, algorithm, timeout, tmp):
    out = os.path.join(tmp, "pairs.npy")
    cmd = [binary, "self-join", path, "--eps", str(eps), "--metric", "cosine", "--backend",
           backend, "--algorithm", algorithm, "--stats", "-o", out]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout {timeout} s"}
    wall = time.perf_counter() - t
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:]}
    stats = json.loads(p.stdout.strip().splitlines()[-1])
    stats["wall"] = wall
    os.remove(out)
    return stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--simjoin-bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--small", action="store_true", help="rehearsal sizes (lavapipe)")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--tmp", default="/tmp/simjoin-cosine")
    args = ap.parse_args()
    os.makedirs(args.tmp, exist_ok=True)
    rows = []
    notes = []
    for name, n, dim, centres, spread, eps, brute in SMALL if args.small else FULL:
        path = os.path.join(args.tmp, name + ".npy")
        t = time.perf_counter()
        np.save(path, make(name, n, dim, centres, spread))
        print(f"{name}: data made in {time.perf_counter() - t:.1f} s", flush=True)
        modes = [("gpu", "auto"), ("cpu", "auto")] + ([("gpu", "brute")] if brute else [])
        got = {}
        for backend, algorithm in modes:
            r = run(args.simjoin_bin, path, eps, backend, algorithm, args.timeout, args.tmp)
            got[(backend, algorithm)] = r
            print(f"  {backend} {algorithm}: {r.get('seconds', r.get('error'))} s, "
                  f"{r.get('pairs')} pairs", flush=True)
            if "notes" in r:
                cosine = [x for x in r["notes"] if x.startswith("cosine:")]
                notes.append(f"- {name} {backend} {algorithm} ({r.get('device')}): " + "; ".join(cosine))
        os.remove(path)
        counts = {r["pairs"] for r in got.values() if "pairs" in r}
        g = got[("gpu", "auto")].get("seconds")
        cell = lambda r: f"{r['seconds']:.2f}" if "seconds" in r else r.get("error", "-")  # noqa: E731
        ratio = lambda r: f"{r['seconds'] / g:.1f}x" if g and "seconds" in r else "-"  # noqa: E731
        c, b = got[("cpu", "auto")], got.get(("gpu", "brute"), {"error": "not run"})
        rows.append(f"| {name} | {n:,} | {dim} | {eps} | {'/'.join(map(str, sorted(counts)))} "
                    f"| {cell(got[('gpu', 'auto')])} | {cell(c)} | {cell(b)} | {ratio(c)} | {ratio(b)} |")
        if len(counts) > 1:
            notes.append(f"- {name}: PAIR COUNTS DIFFER: {sorted(counts)}")
    table = ["| workload | n | dims | eps (1 - cos) | pairs | simjoin GPU grouped s | simjoin CPU s "
             "| GPU brute force s | CPU / GPU grouped | brute / GPU grouped |",
             "|---|---|---|---|---|---|---|---|---|---|"] + rows
    text = "\n".join(table + ["", "Notes (what ran):"] + notes) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
