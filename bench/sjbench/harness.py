"""Orchestration: generate each workload, choose its eps, run every system at every eps,
check that all agree on the pair count, and hand the results to the report."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import runner
from . import workloads as wl
from .runner import (
    BENCH_DIR,
    REPO_DIR,
    Outcome,
    is_software,
    list_vulkan_devices,
    run_peer,
    run_simjoin_cli,
)

LAVAPIPE_ICD = "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"
PEER_LABELS = {
    "scipy-ckdtree": "scipy cKDTree.query_pairs",
    "sklearn-radius-graph": "sklearn radius_neighbors_graph",
    "faiss-flat-range": "FAISS IndexFlatL2.range_search",
}


@dataclass
class System:
    key: str  # stable id used in JSON
    label: str  # what tables and plots call it
    is_simjoin: bool
    exact: bool  # decides pairs in f64 with `<=`: must match the reference exactly
    run: Callable[[Path, float, int, float], Outcome]
    timeout: float | None = None  # overrides the global per-run timeout


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Systems


def simjoin_systems(args, software: bool) -> list[System]:
    """simjoin's CPU backend and one entry per Vulkan device (`software`: only lavapipe-like
    devices, else only real GPUs)."""
    binary = Path(args.simjoin_bin)
    out = []
    if not software and "simjoin-cpu" in args.systems:
        for algo in args.simjoin_algorithms:
            suffix = "" if algo == "auto" else f" ({algo})"
            out.append(
                System(
                    f"simjoin-cpu{'' if algo == 'auto' else '-' + algo}",
                    f"simjoin CPU{suffix}",
                    True,
                    True,
                    lambda d, e, r, t, algo=algo: run_simjoin_cli(binary, d, e, r, t, "cpu", algo),
                )
            )
    if not software and "simjoin-python" in args.systems:
        out.append(System("simjoin-python", "simjoin CPU via Python bindings", True, True,
                          lambda d, e, r, t: run_peer("simjoin-python", d, e, r, t)))  # fmt: skip
    if "simjoin-vulkan" not in args.systems:
        return out
    for dev in args.vulkan_devices:
        if is_software(dev) != software:
            continue
        name = dev["name"]
        # lavapipe's name is long ("llvmpipe (LLVM 15.0.6, 256 bits)"): keep its first word.
        label = f"simjoin Vulkan: {name.split()[0]} (lavapipe, software)" if is_software(dev) else f"simjoin Vulkan: {name}"
        env = dev.get("env")
        out.append(
            System(
                f"simjoin-vk{dev['index']}",
                label,
                True,
                True,
                lambda d, e, r, t, idx=str(dev["index"]), env=env: run_simjoin_cli(
                    binary, d, e, r, t, "gpu", "auto", device=idx, env_extra=env
                ),
                timeout=args.lavapipe_timeout if is_software(dev) else None,
            )
        )
    return out


def peer_systems(args) -> list[System]:
    return [
        System(p, PEER_LABELS[p], False, p != "faiss-flat-range",
               lambda d, e, r, t, p=p: run_peer(p, d, e, r, t))
        for p in ("scipy-ckdtree", "sklearn-radius-graph", "faiss-flat-range")
        if p in args.systems
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------
# Running a suite


def summarise(outcome: Outcome) -> dict:
    times = [r["seconds"] for r in outcome.runs]
    row = {
        "status": outcome.status,
        "message": outcome.message,
        "times": times,
        "median": statistics.median(times) if times and outcome.status == "ok" else None,
        "pairs": outcome.pairs,
    }
    first = outcome.runs[0] if outcome.runs else {}
    if "wall" in first:  # simjoin: keep what --stats said about the run
        row["wall_median"] = statistics.median(r["wall"] for r in outcome.runs)
        for key in ("backend", "device", "algorithm", "batches", "notes", "index_build", "bytes_to_device", "bytes_from_device"):
            if key in first:
                row[key] = first[key]
        row["phases"] = median_phases([r.get("phases") for r in outcome.runs])
    if len({r["pairs"] for r in outcome.runs}) > 1:
        row["status"] = "error"
        row["message"] = f"pair count changed between repetitions: {[r['pairs'] for r in outcome.runs]}"
    return row


def phase_list(phases) -> list[tuple[str, float]]:
    """--stats phases as [(name, seconds)], from a list of pairs, of objects, or a dict."""
    if isinstance(phases, dict):
        return [(k, float(v)) for k, v in phases.items()]
    out = []
    for p in phases or []:
        if isinstance(p, dict):
            out.append((str(p.get("name")), float(p.get("seconds", 0.0))))
        else:
            out.append((str(p[0]), float(p[1])))
    return out


def median_phases(all_phases: list) -> list[list]:
    """Per-phase medians over repetitions, in the order of the first repetition."""
    lists = [phase_list(p) for p in all_phases]
    if not lists or not lists[0]:
        return []
    out = []
    for i, (name, _) in enumerate(lists[0]):
        vals = [lst[i][1] for lst in lists if i < len(lst) and lst[i][0] == name]
        out.append([name, statistics.median(vals)])
    return out


def check_agreement(rows: dict[str, dict], systems: list[System], tolerance: float) -> int | None:
    """Marks each row `agrees` True/False against the reference count and returns it.

    Exact systems (f64, `<=`) must match exactly; FAISS (f32 with |x|^2+|y|^2-2xy) must be
    within `tolerance` relative. The reference is scipy's count, else sklearn's, else
    simjoin CPU's."""
    order = ["scipy-ckdtree", "sklearn-radius-graph", "simjoin-cpu"]
    ok = {k: r for k, r in rows.items() if r["status"] == "ok"}
    reference = next((ok[k]["pairs"] for k in order if k in ok), None)
    if reference is None:
        exact_ok = [ok[s.key]["pairs"] for s in systems if s.exact and s.key in ok]
        reference = exact_ok[0] if exact_ok else None
    for s in systems:
        row = rows.get(s.key)
        if row is None or row["status"] != "ok" or reference is None:
            continue
        diff = row["pairs"] - reference
        row["deviation"] = diff
        if s.exact:
            row["agrees"] = diff == 0
        else:
            row["agrees"] = abs(diff) <= tolerance * max(reference, 1)
    return reference


def run_suite(name: str, workload_sizes: list[tuple[wl.Workload, int]], systems: list[System], args) -> list[dict]:
    results = []
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    for w, n in workload_sizes:
        t0 = time.perf_counter()
        x = wl.generate(w, n, args.seed)
        path = data_dir / f"{w.name}-n{n}-s{args.seed}.npy"
        np.save(path, x)
        eps_list = args.eps.get(w.name) or wl.choose_eps(x, args.selectivities, seed=args.seed)
        log(f"[{name}] {w.name}: n={n} d={w.dim} eps={eps_list} (data + eps in {time.perf_counter() - t0:.1f} s)")
        given_up: dict[str, str] = {}
        points = []
        for eps in eps_list:
            rows: dict[str, dict] = {}
            for s in systems:
                if s.key in given_up:
                    rows[s.key] = {"status": "skipped", "message": given_up[s.key], "median": None, "pairs": None, "times": []}
                    continue
                timeout = s.timeout or args.timeout
                outcome = s.run(path, eps, args.repeats, timeout)
                row = summarise(outcome)
                rows[s.key] = row
                if row["status"] in ("timeout", "error"):
                    # Larger eps only costs more: don't spend the budget finding that out again.
                    given_up[s.key] = f"{row['status']} at eps = {eps:g}"
                shown = f"{row['median']:.3f} s" if row["median"] is not None else row["status"]
                log(f"    eps={eps:<10g} {s.label:<45} {shown:>12}  pairs={row['pairs']}  {row['message']}")
            reference = check_agreement(rows, systems, args.faiss_tolerance)
            for s in systems:
                if rows[s.key].get("agrees") is False:
                    log(f"    !! {s.label} counts {rows[s.key]['pairs']} pairs, reference {reference}")
            points.append({
                "eps": eps,
                "pairs": reference,
                "selectivity": wl.selectivity(reference, n) if reference is not None else None,
                "systems": rows,
            })  # fmt: skip
        results.append({
            "workload": w.name, "family": w.family, "dim": w.dim, "n": n,
            "description": w.describe(), "source": w.source,
            "target_selectivities": args.selectivities, "points": points,
        })  # fmt: skip
        if not args.keep_data:
            path.unlink(missing_ok=True)
    return results


# ---------------------------------------------------------------------------------------
# Machine description


def machine_info(args) -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem_gib = round(kib / 2**20, 1)
    except (OSError, IndexError, ValueError):
        pass
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("scipy", "sklearn", "faiss", "matplotlib"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            pass
    def git(*cmd: str) -> str:
        # The device machine gets a copy of the tree, possibly without .git or git itself.
        try:
            return subprocess.run(["git", *cmd], cwd=REPO_DIR, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""

    # Without git (the device machine's copy): the commit bench/device/pack.sh recorded.
    commit = git("rev-parse", "--short", "HEAD") or os.environ.get("SIMJOIN_COMMIT", "unknown")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "versions": versions,
        "simjoin_commit": commit + ("+dirty" if dirty else ""),
        "vulkan_devices": [{k: d[k] for k in ("index", "name", "kind") if k in d} for d in args.vulkan_devices],
        # Other work on the machine inflates times: keep the 1/5/15-minute load averages.
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }


# ---------------------------------------------------------------------------------------
# Command line


def parse_eps(items: list[str]) -> dict[str, list[float]]:
    """--eps WORKLOAD=E1,E2,... (repeatable)."""
    out = {}
    for item in items or []:
        name, _, values = item.partition("=")
        out[name] = sorted(float(v) for v in values.split(","))
    return out


def csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


ALL_SYSTEMS = ["simjoin-cpu", "simjoin-vulkan", "simjoin-python", *PEER_LABELS]
DEFAULT_SYSTEMS = [s for s in ALL_SYSTEMS if s != "simjoin-python"]  # the bindings time the same engine


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workloads", type=csv, default=list(wl.WORKLOADS),
                   help=f"comma list of: {', '.join(wl.WORKLOADS)}")  # fmt: skip
    p.add_argument("--selectivities", type=lambda s: [float(v) for v in csv(s)], default=[1, 10, 100],
                   help="target neighbours per point (self excluded); eps is chosen per workload by sampling")  # fmt: skip
    p.add_argument("--eps", action="append", metavar="WORKLOAD=E1,E2", help="fixed eps for a workload instead of sampling")
    p.add_argument("--repeats", type=int, default=3, help="runs per (system, eps); the median is reported")
    p.add_argument("--repeat-budget", type=float, default=10.0,
                   help="stop repeating a (system, eps) once its runs took this many seconds in total")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--simjoin-bin", default=str(REPO_DIR / "target/release/simjoin"))
    p.add_argument("--no-build", action="store_true", help="don't run `cargo build --release --bin simjoin` first")
    p.add_argument("--simjoin-algorithms", type=csv, default=["auto"],
                   help="simjoin CPU algorithms to run (auto, grid, ego, brute, lss)")  # fmt: skip
    p.add_argument("--simjoin-output", choices=["pairs", "count"], default="pairs",
                   help="pairs: simjoin materialises the pairs like the peers (default); count: count only")  # fmt: skip
    p.add_argument("--no-warmup", action="store_true",
                   help="don't make one untimed run of simjoin on a Vulkan device before timing it")  # fmt: skip
    p.add_argument("--data-dir", default=str(BENCH_DIR / "out/data"))
    p.add_argument("--keep-data", action="store_true", help="keep the generated .npy files")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__)
    sub = p.add_subparsers(dest="mode")
    main = sub.add_parser("compare", help="(default) simjoin beside its peers on this machine")
    add_common(main)
    main.add_argument("--n", type=int, help="points per workload (overrides every default size)")
    main.add_argument("--scale", type=float, default=1.0, help="multiply every default size")
    main.add_argument("--systems", type=csv, default=DEFAULT_SYSTEMS, help=f"comma list of: {', '.join(ALL_SYSTEMS)}")
    main.add_argument("--timeout", type=float, default=30.0, help="seconds allowed per run")
    main.add_argument("--lavapipe-n", type=int, default=10_000, help="size cap for software Vulkan devices")
    main.add_argument("--lavapipe-timeout", type=float, default=30.0)
    main.add_argument("--faiss-tolerance", type=float, default=1e-2,
                      help="relative pair-count deviation allowed to FAISS (f32, expanded distance)")  # fmt: skip
    main.add_argument("--out", default=str(BENCH_DIR / "results"))
    main.add_argument("--no-markdown", action="store_true", help="don't rewrite BENCHMARKS.md")
    main.add_argument("--quick", action="store_true", help="smoke test: n=3000, 1 repeat, 2 selectivities")
    gpu = sub.add_parser("gpu", help="simjoin only, on a named Vulkan device, at large sizes, with per-phase times")
    add_common(gpu)
    gpu.add_argument("--device", required=True, help="Vulkan device index or name substring (SIMJOIN_DEVICE)")
    gpu.add_argument("--sizes", type=lambda s: [int(float(v)) for v in csv(s)], default=[2_000_000, 10_000_000])
    gpu.add_argument("--timeout", type=float, default=300.0)
    gpu.add_argument("--precision", choices=["f32", "f64"],
                     help="join precision (default f64, as generated); --with-cpu uses the same")  # fmt: skip
    gpu.add_argument("--with-cpu", action="store_true", help="also run simjoin's CPU backend (checks the pair count)")
    gpu.add_argument("--with-auto", action="store_true",
                     help="also run simjoin with --backend auto (the engine's own choice of CPU or GPU)")  # fmt: skip
    gpu.add_argument("--bandwidth-mib", type=int, default=256, help="transfer size of the link measurement")
    gpu.add_argument("--in-process-repeat", type=int, default=2,
                     help="joins per simjoin process, the last timed (1: a fresh process's join, after a warm-up process)")  # fmt: skip
    gpu.add_argument("--tiled-only", action="store_true",
                     help="with --compare-tiles, only the run with the tiles forced on (SIMJOIN_GPU_TILE=1)")  # fmt: skip
    gpu.add_argument("--no-gpu-warmup", action="store_true",
                     help="with --in-process-repeat 1, no untimed warm-up process before the GPU rows")  # fmt: skip
    gpu.add_argument("--compare-rows", action="store_true",
                     help="also run the GPU join with sorted output as rows sorted on the device (SIMJOIN_GPU_ROWS=1) beside the default host sort")  # fmt: skip
    gpu.add_argument("--compare-tiles", action="store_true",
                     help="also run the GPU join with the filter's shared-memory tiles off and on (SIMJOIN_GPU_TILE=0, 1)")  # fmt: skip
    gpu.add_argument("--gds-join", metavar="DIR",
                     help="also run GDS-Join, the seed authors' CUDA code, built with nvcc from the sources in DIR")  # fmt: skip
    gpu.add_argument("--gds-compute", type=int, default=90, help="GDS-Join's compute capability (H100/H200: 90)")
    gpu.add_argument("--gds-define", action="append", default=[], metavar="NAME=VALUE",
                     help="another params.h setting for GDS-Join, e.g. STAMP=1 (unicomp)")  # fmt: skip
    gpu.add_argument("--out", default=str(BENCH_DIR / "out/gpu"))
    lss = sub.add_parser("lss", help="the LSS paper's experiments: GPU LSS join vs GPU grid join on one Vulkan device")
    add_common(lss)
    lss.add_argument("--device", required=True,
                     help="Vulkan device index or name substring, or 'lavapipe' (the software driver)")  # fmt: skip
    lss.add_argument("--experiments", type=csv, default=["n", "eps", "lists"], help="comma list of: n, eps, lists")
    lss.add_argument("--scale", type=float, default=1.0, help="multiply the fixed sizes (256k for eps, 64k for lists)")
    lss.add_argument("--max-n", type=int, default=1_000_000, help="cap of the n sweep (1k to 1M)")
    lss.add_argument("--timeout", type=float, default=300.0)
    lss.add_argument("--no-cpu", action="store_true", help="don't run simjoin's CPU grid join (the pair-count reference)")
    lss.add_argument("--out", default=str(BENCH_DIR / "out/lss"))
    if not argv or argv[0] not in ("compare", "gpu", "lss", "-h", "--help"):
        argv = ["compare", *argv]
    args = p.parse_args(argv)
    args.eps = parse_eps(args.eps)
    for w in args.workloads:
        if w not in wl.WORKLOADS:
            p.error(f"unknown workload {w!r} (known: {', '.join(wl.WORKLOADS)})")
    if args.mode == "compare":
        for s in args.systems:
            if s not in ALL_SYSTEMS:
                p.error(f"unknown system {s!r} (known: {', '.join(ALL_SYSTEMS)})")
        if args.quick:
            args.n, args.repeats, args.selectivities = args.n or 3000, 1, [1, 25]
    return args


def build_simjoin(args) -> None:
    if args.no_build:
        return
    if shutil.which("cargo") is None:
        log("no cargo on this machine: using the simjoin binary as it is")
        return
    cmd = ["cargo", "build", "--release", "--bin", "simjoin"]
    if "simjoin-python" in getattr(args, "systems", []):
        cmd.append("--lib")  # libsimjoin.so for the Python bindings
    log("building simjoin: " + " ".join(cmd))
    subprocess.run(cmd, cwd=REPO_DIR, check=True)


def find_devices(args) -> list[dict]:
    """Real Vulkan devices as the loader sees them, plus lavapipe pinned by its ICD file."""
    binary = Path(args.simjoin_bin)
    devices = [d for d in list_vulkan_devices(binary) if not is_software(d)]
    if Path(LAVAPIPE_ICD).exists():
        for d in list_vulkan_devices(binary, {"VK_DRIVER_FILES": LAVAPIPE_ICD}):
            if is_software(d):
                devices.append(dict(d, env={"VK_DRIVER_FILES": LAVAPIPE_ICD}))
    return devices


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    runner.REPEAT_BUDGET_S = args.repeat_budget
    runner.SIMJOIN_OUTPUT = args.simjoin_output
    runner.VULKAN_WARMUP = not args.no_warmup
    runner.SIMJOIN_PRECISION = getattr(args, "precision", None)
    build_simjoin(args)
    if args.mode == "gpu":
        from .gpu_mode import run_gpu_mode

        return run_gpu_mode(args)
    if args.mode == "lss":
        from .lss_mode import run_lss_mode

        return run_lss_mode(args)
    have_cli = Path(args.simjoin_bin).exists()
    if not have_cli:
        log(f"warning: no simjoin binary at {args.simjoin_bin}: simjoin systems will report errors")
    args.vulkan_devices = find_devices(args) if "simjoin-vulkan" in args.systems and have_cli else []
    log(f"Vulkan devices: {[d['name'] for d in args.vulkan_devices] or 'none'}")
    started = time.perf_counter()
    chosen = [wl.WORKLOADS[name] for name in args.workloads]
    sizes = [(w, args.n or max(2, int(w.default_n * args.scale))) for w in chosen]
    main_systems = simjoin_systems(args, software=False) + peer_systems(args)
    results = {"machine": machine_info(args), "options": {
        "repeats": args.repeats, "repeat_budget_s": args.repeat_budget, "simjoin_output": args.simjoin_output, "vulkan_warmup": not args.no_warmup, "timeout_s": args.timeout, "selectivities": args.selectivities,
        "faiss_tolerance": args.faiss_tolerance, "lavapipe_n": args.lavapipe_n,
        "lavapipe_timeout_s": args.lavapipe_timeout, "seed": args.seed,
        "command": " ".join(["python3 bench/run.py", *argv]),
    }}  # fmt: skip
    results["systems"] = {s.key: s.label for s in main_systems}
    results["suites"] = {"main": run_suite("main", sizes, main_systems, args)}
    software = simjoin_systems(args, software=True)
    if software:
        # lavapipe is a correctness device: run it at a capped size beside simjoin CPU and
        # scipy (the reference), with eps re-chosen for that size.
        small_systems = [s for s in main_systems if s.key in ("simjoin-cpu", "scipy-ckdtree")] + software
        small = [(w, min(n, args.lavapipe_n)) for w, n in sizes]
        results["systems"].update({s.key: s.label for s in software})
        results["suites"]["software-vulkan"] = run_suite("software-vulkan", small, small_systems, args)
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    results["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    from .report import write_report

    write_report(results, out, None if args.no_markdown else REPO_DIR / "BENCHMARKS.md")
    exact = {s.key for s in main_systems + software if s.exact}
    bad = [
        (suite, w["workload"], p["eps"], key)
        for suite, ws in results["suites"].items() for w in ws for p in w["points"]
        for key, row in p["systems"].items() if row.get("agrees") is False and key in exact
    ]  # fmt: skip
    log(f"done in {results['elapsed_s']} s; results in {out}")
    if bad:
        log(f"PAIR COUNTS DISAGREE: {bad}")
        return 1
    return 0
