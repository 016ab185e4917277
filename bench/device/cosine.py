"""Issue 40 on a GPU: the grouped cosine join with its tiles on the device (gpu/grouped.rs)
against the same join on simjoin's CPU backend (every core of the machine) and against the
GPU's brute force (`--algorithm brute`: every pair in the grouped join's tiles, `Plan::brute`,
on the workloads flagged below: uniform data, where the grouped index declines), and against
PyTorch on the same GPU (where the device image has it): a chunked `X @ X.T` of the
normalised rows with a threshold, in f32 (TF32 off) and in f16, pairs (i < j) as a NumPy
array, timed from the rows in host memory to the pairs in host memory after a warm-up.
simjoin runs through the CLI with the pairs written sorted to a .npy file (what a user
gets); its column is the join's own time (`seconds`: a fresh process, so the device's
opening and the kernels' compiles are in it), the process's wall time in the notes. With
--warm-bin (examples/gpu_join_bench) the same joins also run on an engine kept open, the
best of the runs after the first (as PyTorch is timed after a warm-up), pairs in a Vec as
the Python binding hands them over, with the GPU run's phases. Data:
bench/embed_bench.py's generator (clusters around random centres, and uniform on the
sphere). Prints a Markdown table with ratios; every system's pair count must agree.

    python3 bench/device/cosine.py --simjoin-bin .device/simjoin \
        [--warm-bin .device/gpu_join_bench] --out OUT [--small]
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

# name, n, dim, centres, spread, eps (cosine distance), brute force too (where the index
# declines: the brute force in tiles against the general join `auto` falls back to)
FULL = [
    ("clusters-384d-100k", 100_000, 384, 2000, 0.016, 0.1, False),
    ("clusters-768d-100k", 100_000, 768, 2000, 0.011, 0.1, False),
    ("sphere-384d-100k", 100_000, 384, 0, 0.0, 0.1, True),
    ("dups-384d-100k", 100_000, 384, 2000, 0.03, 0.001, False),
    ("clusters-384d-1m", 1_000_000, 384, 10_000, 0.016, 0.1, False),
]
SMALL = [
    ("clusters-384d-6k", 6_000, 384, 120, 0.016, 0.1, True),
    ("sphere-128d-5k", 5_000, 128, 0, 0.0, 0.1, True),
]


def run(binary, path, eps, backend, algorithm, timeout, tmp, env=None):
    out = os.path.join(tmp, "pairs.npy")
    cmd = [binary, "self-join", path, "--eps", str(eps), "--metric", "cosine", "--backend",
           backend, "--algorithm", algorithm, "--stats", "-o", out]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired:
        return {"error": f"timeout {timeout} s"}
    wall = time.perf_counter() - t
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:]}
    stats = json.loads(p.stdout.strip().splitlines()[-1])
    stats["wall"] = wall
    os.remove(out)
    return stats


def warm(binary, path, eps, repeat, timeout, env=None):
    """The join on an engine kept open (examples/gpu_join_bench.rs --npy): `repeat` runs on
    the GPU, then on the CPU backend, in one process. The first GPU run opens the device
    and compiles the kernels; the later ones are what a program or a Python session that
    joins more than once waits for (as PyTorch's column, timed after a warm-up). Returns
    {"gpu_first", "gpu", "cpu", "pairs", "gpu_phases", "gpu_notes"} or {"error"}."""
    cmd = [binary, "--npy", path, "--metric", "cosine", "--eps", str(eps), "--algorithm", "auto",
           "--repeat", str(repeat), "--cpu"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired:
        return {"error": f"timeout {timeout} s"}
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:]}
    gpu, cpu, pairs, phases, notes = [], [], set(), [], []
    for line in p.stdout.splitlines():
        w = line.split()
        if line.startswith("run "):
            gpu.append(float(w[2]))
            pairs.add(int(w[4]))
            phases, notes = [], []
        elif line.startswith("cpu run "):
            cpu.append(float(w[3]))
            pairs.add(int(w[5]))
        elif line.startswith("    note: ") and len(cpu) == 0:
            notes.append(line[len("    note: "):])
        elif line.startswith("    ") and line.rstrip().endswith(" s") and len(cpu) == 0:
            name, secs = line.strip().rsplit(" ", 2)[0].strip(), float(w[-2])
            phases.append(f"{name} {secs:.3f} s")
    if not gpu or not cpu:
        return {"error": "no runs in the output: " + p.stdout[-200:]}
    return {"gpu_first": gpu[0], "gpu": min(gpu[1:] or gpu), "cpu": min(cpu[1:] or cpu),
            "pairs": pairs, "gpu_phases": phases, "gpu_notes": notes}


def torch_join(x, eps, half, chunk=4096):
    """PyTorch's brute force: pairs i < j with cos(x_i, x_j) >= 1 - eps, as NumPy (i, j)
    rows sorted (row-major nonzero per chunk of rows). Returns (pairs, seconds)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.cuda.synchronize()
    t = time.perf_counter()
    g = torch.from_numpy(x).cuda()
    g = torch.nn.functional.normalize(g, dim=1)
    if half:
        g = g.half()
    n = g.shape[0]
    out = []
    for i0 in range(0, n, chunk):
        i1 = min(n, i0 + chunk)
        s = g[i0:i1] @ g[i0:].T
        keep = s.float() >= (1.0 - eps)
        # Upper triangle only: column (i0 + c) > row (i0 + r).
        keep[:, : i1 - i0] &= torch.ones(i1 - i0, i1 - i0, dtype=torch.bool, device=g.device).triu(1)
        nz = keep.nonzero()
        nz[:, 0] += i0
        nz[:, 1] += i0
        out.append(nz)
        del s, keep
    pairs = torch.cat(out).cpu().numpy()
    torch.cuda.synchronize()
    return pairs, time.perf_counter() - t


def have_torch():
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--simjoin-bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--small", action="store_true", help="rehearsal sizes (lavapipe)")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--tmp", default="/tmp/simjoin-cosine")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--only", default="", help="comma list of workload names (default: all)")
    ap.add_argument("--no-brute", action="store_true", help="skip the GPU brute force rows")
    ap.add_argument("--warm-bin", default="", help="examples/gpu_join_bench: the joins on an engine kept open")
    ap.add_argument("--warm-repeat", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(args.tmp, exist_ok=True)
    rows = []
    notes = []
    torch_ok = have_torch() and not args.no_torch
    warmed = False
    if not torch_ok:
        notes.append("- PyTorch with CUDA not found here: no PyTorch columns")
    only = set(filter(None, args.only.split(",")))
    for name, n, dim, centres, spread, eps, brute in SMALL if args.small else FULL:
        if only and name not in only:
            continue
        brute = brute and not args.no_brute
        path = os.path.join(args.tmp, name + ".npy")
        t = time.perf_counter()
        np.save(path, make(name, n, dim, centres, spread))
        print(f"{name}: data made in {time.perf_counter() - t:.1f} s", flush=True)
        # ("gpu", "f32"): the grouped join with the matrix units off (SIMJOIN_GPU_MATRIX=0).
        modes = [("gpu", "auto"), ("gpu", "f32"), ("cpu", "auto")] + ([("gpu", "brute")] if brute else [])
        got = {}
        if torch_ok:
            x = np.load(path)
            for half in (False, True):
                key = ("torch", "f16" if half else "f32")
                try:
                    if not warmed:
                        torch_join(x[:2048], eps, half)
                        warmed = True
                    pairs, secs = torch_join(x, eps, half)
                    got[key] = {"seconds": secs, "pairs_inexact": len(pairs)}
                    del pairs
                except Exception as e:  # noqa: BLE001 (out of memory and the like: reported)
                    got[key] = {"error": type(e).__name__ + ": " + str(e).splitlines()[0][:80]}
                print(f"  torch {key[1]}: {got[key].get('seconds', got[key].get('error'))} s, "
                      f"{got[key].get('pairs_inexact')} pairs", flush=True)
            del x
            import torch

            torch.cuda.empty_cache()
        for backend, algorithm in modes:
            r = run(args.simjoin_bin, path, eps, backend, "auto" if algorithm == "f32" else algorithm,
                    args.timeout, args.tmp, {"SIMJOIN_GPU_MATRIX": "0"} if algorithm == "f32" else None)
            got[(backend, algorithm)] = r
            print(f"  {backend} {algorithm}: {r.get('seconds', r.get('error'))} s, "
                  f"{r.get('pairs')} pairs", flush=True)
            if "wall" in r:
                notes.append(f"- {name} {backend} {algorithm}: process wall {r['wall']:.2f} s")
            if "notes" in r:
                cosine = [x for x in r["notes"] if x.startswith("cosine:")]
                notes.append(f"- {name} {backend} {algorithm} ({r.get('device')}): " + "; ".join(cosine))
            if r.get("phases"):
                notes.append(f"- {name} {backend} {algorithm} phases: " +
                             ", ".join(f"{p['name']} {p['seconds']:.3f} s" for p in r["phases"]))
        w = {"error": "not run"}
        if args.warm_bin:
            w = warm(args.warm_bin, path, eps, args.warm_repeat, 3 * args.timeout)
            print(f"  warm engine: {w}", flush=True)
            if "error" not in w:
                notes.append(f"- {name} warm engine: GPU runs after the first {w['gpu']:.3f} s "
                             f"(first {w['gpu_first']:.3f} s), CPU {w['cpu']:.3f} s; GPU phases: "
                             + ", ".join(w["gpu_phases"]) + "; " + "; ".join(w["gpu_notes"]))
        os.remove(path)
        counts = {r["pairs"] for r in got.values() if "pairs" in r} | w.get("pairs", set())
        import gc

        gc.collect()
        g = got[("gpu", "auto")].get("seconds")
        cell = lambda r: f"{r['seconds']:.2f}" if "seconds" in r else r.get("error", "-")  # noqa: E731
        ratio = lambda r: f"{r['seconds'] / g:.1f}x" if g and "seconds" in r else "-"  # noqa: E731
        c, b = got[("cpu", "auto")], got.get(("gpu", "brute"), {"error": "not run"})
        f = got[("gpu", "f32")]
        tf, th = (got.get(("torch", h), {"error": "not run"}) for h in ("f32", "f16"))
        wcell = lambda k: f"{w[k]:.2f}" if k in w else w["error"] if isinstance(w.get("error"), str) else "-"  # noqa: E731
        wratio = lambda r: f"{r['seconds'] / w['gpu']:.1f}x" if "gpu" in w and "seconds" in r else "-"  # noqa: E731
        tcount = lambda r: f" ({r['pairs_inexact']:,} pairs)" if "pairs_inexact" in r else ""  # noqa: E731
        rows.append(f"| {name} | {n:,} | {dim} | {eps} | {'/'.join(map(str, sorted(counts)))} "
                    f"| {cell(got[('gpu', 'auto')])} | {cell(f)} | {ratio(f)} | {cell(c)} | {cell(b)} | {cell(tf)}{tcount(tf)} "
                    f"| {cell(th)}{tcount(th)} | {ratio(c)} | {ratio(b)} | {ratio(tf)} "
                    f"| {wcell('gpu')} | {wcell('cpu')} | {wratio(tf)} |")
        if len(counts) > 1:
            notes.append(f"- {name}: PAIR COUNTS DIFFER: {sorted(counts)}")
    table = ["| workload | n | dims | eps (1 - cos) | pairs | simjoin GPU grouped s | same, f32 tiles s "
             "| f32 / default | simjoin CPU s "
             "| GPU brute force s | PyTorch f32 s | PyTorch f16 s | CPU / GPU grouped "
             "| brute / GPU grouped | PyTorch f32 / GPU grouped "
             "| GPU grouped, engine open s | CPU, engine open s | PyTorch f32 / GPU engine open |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"] + rows
    text = "\n".join(table + ["", "Notes (what ran):"] + notes) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
