"""GPU mode: only simjoin, on one named Vulkan device, at large sizes (2M and 10M points by
default), with the per-phase times from `--stats`. Needs numpy only, so it runs with the
python3 of a machine that has no venv (the device machine); results go to --out as JSON and
Markdown with the device named."""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

import numpy as np

from . import gds_join, workloads as wl
from .harness import check_agreement, log, machine_info, summarise, System
from . import runner as cli_runner
from .runner import list_vulkan_devices, measure_bandwidth, run_simjoin_cli


def pick_device(devices: list[dict], wanted: str) -> dict | None:
    if wanted.isdigit():
        return next((d for d in devices if str(d.get("index")) == wanted), None)
    return next((d for d in devices if wanted.lower() in d["name"].lower()), None)


def run_gpu_mode(args) -> int:
    binary = Path(args.simjoin_bin)
    # Each simjoin row: two joins in one process, the second timed (warm device, kept
    # buffers), as a library caller sees it; no separate warm-up process.
    cli_runner.IN_PROCESS_REPEAT = args.in_process_repeat
    cli_runner.VULKAN_WARMUP = not args.no_gpu_warmup
    if not binary.exists():
        log(f"no simjoin binary at {binary}")
        return 2
    devices = list_vulkan_devices(binary)
    args.vulkan_devices = devices
    device = pick_device(devices, args.device)
    log(f"Vulkan devices: {[d['name'] for d in devices]}; chosen: {device['name'] if device else args.device}")
    systems = [System("simjoin-gpu", f"simjoin Vulkan ({args.device})", True, True,
                      lambda d, e, r, t: run_simjoin_cli(binary, d, e, r, t, "gpu", "auto", device=args.device))]  # fmt: skip
    if args.compare_tiles:
        # The high-dimensional filter with its shared-memory tiles forced off and forced on,
        # in the same run, beside the default's own choice: from 8 Euclidean dimensions they
        # differ; below they are the same. (The H100's first run, 2026-11-25: tiles 2.4x
        # faster where the rule chose them, untried where it did not.)
        forced = (("untiled", "0", "filter untiled"), ("tiled", "1", "filter tiled"))
        for key, tile, label in forced[1:] if args.tiled_only else forced:
            systems.append(System(f"simjoin-gpu-{key}", f"simjoin Vulkan ({args.device}), {label}", True, True,
                                  lambda d, e, r, t, tile=tile: run_simjoin_cli(
                                      binary, d, e, r, t, "gpu", "auto", device=args.device,
                                      env_extra={"SIMJOIN_GPU_TILE": tile})))  # fmt: skip
    if args.compare_rows:
        # Sorted output as rows sorted on the device (SIMJOIN_GPU_ROWS=1; the default sorts
        # on the host as the pairs arrive), in the same run.
        systems.append(System("simjoin-gpu-devicerows", f"simjoin Vulkan ({args.device}), device rows", True, True,
                              lambda d, e, r, t: run_simjoin_cli(
                                  binary, d, e, r, t, "gpu", "auto", device=args.device,
                                  env_extra={"SIMJOIN_GPU_ROWS": "1"})))  # fmt: skip
    if args.gds_join:
        # The seed authors' CUDA join on the same GPU and data, built for each dimension.
        defines = dict(d.split("=", 1) for d in args.gds_define)
        dtype = "float" if args.precision == "f32" else "double"
        build_root = Path(args.data_dir) / "gds-build"
        dims = sorted({wl.WORKLOADS[name].dim for name in args.workloads})
        gds_join.prebuild(Path(args.gds_join), build_root, dims, dtype, args.gds_compute, defines, log)
        runner = gds_join.system(Path(args.gds_join), build_root, dtype, args.gds_compute, defines, log)
        systems.append(System("gds-join", "GDS-Join (CUDA)", False, False, runner))
    if args.with_cpu:
        systems.append(System("simjoin-cpu", "simjoin CPU", True, True,
                              lambda d, e, r, t: run_simjoin_cli(binary, d, e, r, t, "cpu", "auto")))  # fmt: skip
    if args.with_auto:
        # The engine's own choice (the device named as for the GPU rows, so auto can pick it).
        systems.append(System("simjoin-auto", "simjoin auto", True, True,
                              lambda d, e, r, t: run_simjoin_cli(binary, d, e, r, t, "auto", "auto", device=args.device)))  # fmt: skip
    # The transfer bound: result bytes over the measured device -> host bandwidth.
    bandwidth = measure_bandwidth(binary, args.device, args.bandwidth_mib)
    log(f"bandwidth: {bandwidth}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = {"mode": "gpu", "machine": machine_info(args), "device": device, "bandwidth": bandwidth,
               "options": {"device": args.device, "in_process_repeat": args.in_process_repeat, "precision": args.precision or "f64", "repeats": args.repeats, "timeout_s": args.timeout, "sizes": args.sizes,
                           "selectivities": args.selectivities, "seed": args.seed},
               "workloads": []}  # fmt: skip
    for name in args.workloads:
        w = wl.WORKLOADS[name]
        for n in args.sizes:
            t0 = time.perf_counter()
            x = wl.generate(w, n, args.seed)
            path = data_dir / f"{w.name}-n{n}-s{args.seed}.npy"
            np.save(path, x)
            eps_list = args.eps.get(w.name) or wl.choose_eps(x, args.selectivities, sample=200, seed=args.seed)
            del x
            log(f"{w.name}: n={n:,} eps={eps_list} (data + eps in {time.perf_counter() - t0:.1f} s)")
            given_up: dict[str, str] = {}
            points = []
            for eps in eps_list:
                rows = {}
                for s in systems:
                    if s.key in given_up:
                        rows[s.key] = {"status": "skipped", "message": given_up[s.key], "median": None, "pairs": None, "times": []}
                        continue
                    outcome = s.run(path, eps, args.repeats, args.timeout)
                    row = summarise(outcome)
                    if s.key == "gds-join" and row["status"] == "ok":
                        # As GDS-Join reports itself (index build excluded), and its index build.
                        row["reported_median"] = statistics.median(r["reported"] for r in outcome.runs)
                        row["index_median"] = statistics.median(r["index"] for r in outcome.runs)
                    rows[s.key] = row
                    if row["status"] != "ok":
                        given_up[s.key] = f"{row['status']} at eps = {eps:g}"
                    shown = f"{row['median']:.4g} s" if row["median"] is not None else row["status"]
                    log(f"    eps={eps:<10g} {s.label:<30} {shown}"
                        f"  pairs={row['pairs']} device={row.get('device')} {row['message']}")  # fmt: skip
                    for phase, secs in row.get("phases", []):
                        log(f"        {phase:<40} {secs:.4f} s")
                    if "bytes_to_device" in row:
                        log(f"        bytes to device {row['bytes_to_device']:,}, from device {row['bytes_from_device']:,}")
                        bound = transfer_bound(row, bandwidth)
                        if bound is not None:
                            row["transfer_bound_s"] = bound
                            log(f"        transfer bound {bound:.4g} s (results at {bandwidth['download_gbps']} GB/s); "
                                f"join = {row['median'] / bound:.3g}x the bound")  # fmt: skip
                    for note in row.get("notes", []):
                        if note.startswith(("overlap", "GPU dot-product filter", "GPU filter")):
                            log(f"        {note}")
                reference = check_agreement(rows, systems, 0.0)
                gds, ours = rows.get("gds-join"), rows.get("simjoin-gpu")
                if gds and ours and gds["status"] == ours["status"] == "ok":
                    gds["speedup_end_to_end"] = gds["median"] / ours["median"]
                    gds["speedup_reported"] = gds["reported_median"] / ours["median"]
                    log(f"    simjoin vs GDS-Join: {gds['speedup_end_to_end']:.3g}x end to end, "
                        f"{gds['speedup_reported']:.3g}x against the time GDS-Join reports"
                        + (f"; GDS-Join's count differs by {gds['deviation']:+,}" if gds.get("deviation") else ""))  # fmt: skip
                points.append({"eps": eps, "pairs": reference,
                               "selectivity": wl.selectivity(reference, n) if reference is not None else None,
                               "systems": rows})  # fmt: skip
                # Written after every point: a run stopped at its time limit keeps what it measured.
                write_results(out, device, args, results, [*results["workloads"], partial(w, n, points)])
            results["workloads"].append(partial(w, n, points))
            if not args.keep_data:
                path.unlink(missing_ok=True)
                path.with_suffix(".csv").unlink(missing_ok=True)  # GDS-Join's copy
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    slug = write_results(out, device, args, results, results["workloads"])
    log(f"done in {results['elapsed_s']} s; wrote {out}/gpu-{slug}.json and .md")
    # A wrong count of simjoin's fails the run; GDS-Join's boundary test (sqrt(d^2) <= eps)
    # may count points at exactly eps differently, which the tables show.
    return 1 if any(r.get("agrees") is False for w in results["workloads"] for p in w["points"]
                    for key, r in p["systems"].items() if key != "gds-join") else 0  # fmt: skip


def partial(w, n: int, points: list) -> dict:
    return {"workload": w.name, "description": w.describe(), "dim": w.dim, "n": n, "points": points}


def write_results(out: Path, device: dict | None, args, results: dict, workloads: list) -> str:
    """Writes gpu-<device>.json and .md under `out`; returns the file name's device part."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", (device or {}).get("name", args.device)).strip("-").lower()
    shown = dict(results, workloads=workloads)
    (out / f"gpu-{slug}.json").write_text(json.dumps(shown, indent=1) + "\n")
    (out / f"gpu-{slug}.md").write_text(gpu_markdown(shown))
    return slug


def transfer_bound(row: dict, bandwidth: dict | None) -> float | None:
    """Seconds the join's device -> host bytes take at the measured bandwidth: no join that
    returns its pairs can be faster."""
    if not bandwidth or row.get("median") is None or not row.get("bytes_from_device"):
        return None
    return row["bytes_from_device"] / (bandwidth["download_gbps"] * 1e9)


def gpu_markdown(results: dict) -> str:
    m = results["machine"]
    dev = results["device"] or {"name": f"{results['options'].get('device')} (not listed by `simjoin info`)"}
    lines = [f"# simjoin GPU mode on {dev['name']}", "",
             f"{m['date_utc']}, host `{m['host']}` ({m['cpu']}, {m['cores']} cores), simjoin `{m['simjoin_commit']}`, "
             f"{results['options'].get('precision', 'f64')} coordinates. "
             f"Median of {results['options']['repeats']} runs; each simjoin run is {results['options'].get('in_process_repeat', 1)} join(s) in one process, the last timed (`--repeat`); `seconds` = the join as `--stats` reports it "
             f"plus, for sorted output, the in-memory sort's finish (every pair in memory, in order), "
             f"`wall` = the whole CLI process (.npy load and Vulkan start-up included). "
             f"GDS-Join rows (where run): `seconds` = its index build + the time it reports, the same span as simjoin's; "
             f"`wall` = its whole process (CSV import and CUDA start-up included).", ""]  # fmt: skip
    bw = results.get("bandwidth")
    if bw:
        lines += [f"Measured copy bandwidth (`simjoin info --bandwidth {bw['mib']}`): host->device {bw['upload_gbps']} GB/s, "
                  f"device->host {bw['download_gbps']} GB/s (the link: pinned buffers, copies in flight on every queue"
                  + (f"; a serial round trip, one copy then one thread reading: {bw['serial_upload_gbps']} / {bw['serial_download_gbps']} GB/s"
                     if "serial_download_gbps" in bw else "")
                  + "). `bound` = the join's bytes from the device at that rate; "
                  f"`x bound` = seconds / bound.", ""]  # fmt: skip
    for w in results["workloads"]:
        lines += [f"## {w['workload']}: {w['description']}, n = {w['n']:,}", "",
                  "| eps | selectivity | pairs | system | seconds | wall | batches | MB to / from device | bound (s) | x bound | overlap | phases (s) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for p in w["points"]:
            for key, r in p["systems"].items():
                sel = f"{p['selectivity']:.3g}" if p["selectivity"] is not None else "?"
                if r["status"] != "ok":
                    pairs = f"{p['pairs']:,}" if p["pairs"] is not None else "?"
                    lines.append(f"| {p['eps']:g} | {sel} | {pairs} | {key} | {r['status']} | | | | | | | {r['message']} |")
                    continue
                phases = "; ".join(f"{name} {secs:.3g}" for name, secs in r.get("phases", []))
                if key == "simjoin-auto":
                    phases = f"{auto_verdict(p['systems'])}; {phases}"
                agree = "" if r.get("agrees", True) else " **WRONG COUNT**"
                if key == "gds-join":
                    agree = f" ({r['deviation']:+,} vs simjoin)" if r.get("deviation") else ""
                    vs = (f"simjoin {r['speedup_end_to_end']:.3g}x faster end to end, "
                          f"{r['speedup_reported']:.3g}x against its reported time; "
                          if "speedup_end_to_end" in r else "")  # fmt: skip
                    phases = (f"{vs}as it reports itself {r['reported_median']:.3g} + its index build "
                              f"{r['index_median']:.3g} (not counted by it); {phases}")  # fmt: skip
                moved = (f"{r['bytes_to_device'] / 1e6:.3g} / {r['bytes_from_device'] / 1e6:.3g}"
                         if "bytes_to_device" in r else "")  # fmt: skip
                b = r.get("transfer_bound_s")
                bound, x_bound = (f"{b:.3g}", f"{r['median'] / b:.3g}") if b else ("", "")
                shown = "GDS-Join (CUDA)" if key == "gds-join" else r.get("device", key) + {"simjoin-gpu-untiled": " (filter untiled)", "simjoin-gpu-tiled": " (filter tiled)", "simjoin-auto": " (auto)", "simjoin-cpu": " (cpu)"}.get(key, "")
                lines.append(f"| {p['eps']:g} | {sel} | {r['pairs']:,}{agree} | {shown} | "
                             f"{r['median']:.3g} | {r.get('wall_median', 0):.3g} | {r.get('batches', '')} | "
                             f"{moved} | {bound} | {x_bound} | {overlap(r.get('notes', []))} | {phases} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines) + "\n"


def auto_verdict(rows: dict) -> str:
    """How `auto` did against the faster of the GPU and CPU rows of the same point."""
    times = {k: rows[k]["median"] for k in ("simjoin-gpu", "simjoin-cpu", "simjoin-auto")
             if k in rows and rows[k]["status"] == "ok"}  # fmt: skip
    if len(times) < 3:
        return "auto: no comparison (a row is missing)"
    best = min(times["simjoin-gpu"], times["simjoin-cpu"])
    ran = rows["simjoin-auto"].get("backend", "?")
    return f"auto ran {ran}: {times['simjoin-auto'] / best:.2f}x the faster backend"


def overlap(notes: list[str]) -> str:
    """The overlap figure of a GPU join's report: busy time of its phases (GPU clock where
    timestamps exist) over the batch loop's wall time; '' when the report has none."""
    for note in notes:
        m = re.match(r"overlap: .* = ([0-9.]+);", note)
        if m:
            return m.group(1)
        if note.startswith("overlap (host clock"):
            return "host clock only"
    return ""
