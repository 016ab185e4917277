"""LSS mode: the LSS paper's experiments (Lieberman, Sankaranarayanan and Samet, "A fast
similarity join algorithm using graphics processing units", §VI) with simjoin's GPU LSS join
beside simjoin's GPU grid join on one Vulkan device:

- "n": uniform [0,1]^16, eps = 0.1, n from 1k to 1M (Figure 3a);
- "eps": uniform [0,1]^16, n = 256k, eps from 0.01 to 0.35 (Figure 3b);
- "lists": uniform [0,1]^16, n = 64k, eps = 0.1 and 0.3, the number of Z-order lists
  (Figure 8c), simjoin's automatic choice beside.

At full scale it is meant for a real GPU. `--scale` multiplies the fixed sizes (256k, 64k)
and `--max-n` caps the n sweep, so that a software device (lavapipe) runs it in minutes:
its figures are CPU figures and say nothing about GPU performance, and the output says so.
simjoin's CPU grid join runs beside as the pair-count reference (`--no-cpu` to skip).
Results go to --out as JSON and Markdown with the device named."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np

from .harness import LAVAPIPE_ICD, check_agreement, log, machine_info, summarise, System
from .runner import is_software, list_vulkan_devices, run_simjoin_cli

DIM = 16
N_SWEEP = [1_000, 4_000, 16_000, 64_000, 256_000, 1_000_000]
EPS_SWEEP = [0.01, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35]
LISTS = [1, 2, 4, 6, 9, 12, 17]


def experiments(args) -> list[dict]:
    """(experiment, n, eps, lists-or-None) points of the three experiments at this scale."""
    out = []
    if "n" in args.experiments:
        sizes = sorted({min(n, args.max_n) for n in N_SWEEP})
        out += [{"experiment": "n", "n": n, "eps": 0.1, "lists": [None]} for n in sizes]
    if "eps" in args.experiments:
        n = max(1000, int(256_000 * args.scale))
        out += [{"experiment": "eps", "n": n, "eps": e, "lists": [None]} for e in EPS_SWEEP]
    if "lists" in args.experiments:
        n = max(1000, int(64_000 * args.scale))
        out += [{"experiment": "lists", "n": n, "eps": e, "lists": [None, *LISTS]} for e in (0.1, 0.3)]
    return out


def run_lss_mode(args) -> int:
    binary = Path(args.simjoin_bin)
    if not binary.exists():
        log(f"no simjoin binary at {binary}")
        return 2
    # "lavapipe" pins the software driver by its ICD file; anything else names a device.
    env = {"VK_DRIVER_FILES": LAVAPIPE_ICD} if args.device == "lavapipe" else None
    wanted = "llvmpipe" if args.device == "lavapipe" else args.device
    devices = list_vulkan_devices(binary, env)
    device = next((d for d in devices if str(d["index"]) == wanted or wanted.lower() in d["name"].lower()), None)
    if device is None:
        log(f"no Vulkan device {args.device!r} among {[d['name'] for d in devices]}")
        return 2
    software = is_software(device)
    log(f"device: {device['name']}{' (software: CPU figures, not GPU performance)' if software else ''}")

    def gpu(key, label, algorithm, lists=None):
        extra = ["--lss-lists", str(lists)] if lists else []
        return System(key, label, True, True, lambda d, e, r, t: run_simjoin_cli(
            binary, d, e, r, t, "gpu", algorithm, device=wanted, env_extra=env, extra=extra))  # fmt: skip

    cpu = [System("cpu-grid", "simjoin CPU grid", True, True,
                  lambda d, e, r, t: run_simjoin_cli(binary, d, e, r, t, "cpu", "grid"))]  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = {"mode": "lss", "machine": machine_info(dict_args(args, devices)), "device": device, "software": software,
               "options": {"scale": args.scale, "max_n": args.max_n, "repeats": args.repeats, "timeout_s": args.timeout,
                           "seed": args.seed, "experiments": args.experiments},
               "points": []}  # fmt: skip
    given_up: dict[tuple, str] = {}
    for point in experiments(args):
        n, eps = point["n"], point["eps"]
        rng = np.random.default_rng(args.seed)
        path = data_dir / f"lss-uniform16-n{n}-s{args.seed}.npy"
        np.save(path, rng.random((n, DIM), dtype=np.float32))
        systems = [gpu("lss" if lists is None else f"lss-{lists}",
                       "LSS (lists: auto)" if lists is None else f"LSS ({lists} lists)", "lss", lists)
                   for lists in point["lists"]]  # fmt: skip
        systems.append(gpu("grid", "grid", "grid"))
        if not args.no_cpu:
            systems += cpu
        rows = {}
        for s in systems:
            # A system that timed out at a smaller size or eps would only take longer.
            key = (point["experiment"], s.key)
            if key in given_up:
                rows[s.key] = {"status": "skipped", "message": given_up[key], "median": None, "pairs": None, "times": []}
                continue
            row = summarise(s.run(path, eps, args.repeats, args.timeout))
            rows[s.key] = row
            if row["status"] == "timeout":
                given_up[key] = f"timeout at n = {n}, eps = {eps:g}"
            shown = f"{row['median']:.4g} s" if row["median"] is not None else row["status"]
            log(f"[{point['experiment']}] n={n:<8} eps={eps:<5g} {s.label:<20} {shown:>10}  pairs={row['pairs']} "
                f"{'; '.join(row.get('notes') or [])[:120]} {row['message']}")  # fmt: skip
        check_agreement(rows, systems, 0.0)
        results["points"].append(dict(point, systems=rows))
        path.unlink(missing_ok=True)
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    results["machine"]["load_average_end"] = [round(x, 2) for x in __import__("os").getloadavg()]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device["name"]).strip("-").lower()
    (out / f"lss-{slug}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"lss-{slug}.md").write_text(lss_markdown(results))
    log(f"done in {results['elapsed_s']} s; wrote {out}/lss-{slug}.json and .md")
    wrong = [(p["experiment"], p["n"], p["eps"], k) for p in results["points"]
             for k, r in p["systems"].items() if r.get("agrees") is False]  # fmt: skip
    if wrong:
        log(f"PAIR COUNTS DISAGREE: {wrong}")
    return 1 if wrong else 0


def dict_args(args, devices):
    """machine_info reads the Vulkan devices from args."""
    args.vulkan_devices = devices
    return args


def lss_markdown(results: dict) -> str:
    m, dev = results["machine"], results["device"]
    o = results["options"]
    caveat = (
        " **Software Vulkan (lavapipe): these are CPU figures at reduced scale, not GPU performance.**"
        if results["software"] else ""
    )  # fmt: skip
    lines = [f"# LSS vs grid join on {dev['name']}", "",
             f"{m['date_utc']}, host `{m['host']}` ({m['cpu']}, {m['cores']} cores), simjoin `{m['simjoin_commit']}`, "
             f"uniform [0,1]^{DIM} float32, self-join, Euclidean; scale {o['scale']} (n sweep capped at {o['max_n']:,}); "
             f"median of up to {o['repeats']} runs after one untimed warm-up; `seconds` = the join as `--stats` reports it. "
             f"Load average at start {m['load_average_start']}, at end {m.get('load_average_end')}.{caveat}", ""]  # fmt: skip
    for exp, title in (("n", "n sweep, eps = 0.1"), ("eps", "eps sweep"), ("lists", "number of Z-order lists")):
        pts = [p for p in results["points"] if p["experiment"] == exp]
        if not pts:
            continue
        keys = list(dict.fromkeys(k for p in pts for k in p["systems"]))
        lines += [f"## {title}", "", "| n | eps | pairs | " + " | ".join(keys) + " | grid s / LSS s (> 1: LSS faster) |",
                  "|---|---|---|" + "---|" * len(keys) + "---|"]  # fmt: skip
        for p in pts:
            cells = []
            for k in keys:
                r = p["systems"].get(k, {})
                if r.get("median") is None:
                    cells.append(r.get("status", ""))
                else:
                    cells.append(f"{r['median']:.3g}" + ("" if r.get("agrees", True) else " **WRONG**"))
            ref = next((r["pairs"] for r in p["systems"].values() if r.get("pairs") is not None), None)
            lss, grid = p["systems"].get("lss", {}).get("median"), p["systems"].get("grid", {}).get("median")
            ratio = f"{grid / lss:.2f}" if lss and grid else ""
            lines.append(f"| {p['n']:,} | {p['eps']:g} | {ref if ref is not None else '?':} | " + " | ".join(cells) + f" | {ratio} |")
        notes = {n for p in pts for n in (p["systems"].get("lss", {}).get("notes") or []) if "list" in n}
        if notes:
            lines += ["", "LSS notes: " + "; ".join(sorted(notes))[:600]]
        lines.append("")
    return "\n".join(lines) + "\n"
