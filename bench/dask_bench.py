"""simjoin.dask against the single-machine join: overhead, balance on clustered data, and a
join whose pairs do not fit in this machine's memory, written to Parquet through Dask.

    python bench/dask_bench.py --out bench/DASK_RESULTS.md            # all three parts
    python bench/dask_bench.py --parts overhead,balance --quick       # small sizes

Needs the installed simjoin package (pip install './bindings/python[dask]'). Runs a
distributed.LocalCluster of 2 worker processes x 1 thread, and gives each worker's engine
1 thread (threads=1), so the cluster uses as many cores as the single-machine join
(threads=None: all cores). The input is generated on the workers (dask.array's random
generator) and persisted there before timing; the single-machine join gets the same numbers
(the same array computed into the client). Every Dask result is checked against the
single-machine pair count (output="count", which does not materialise pairs), and in the
overhead part against the full pair set.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np

import dask
import dask.array as da
from distributed import Client, LocalCluster, get_task_stream

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkout import use_checkout  # noqa: E402

LIBRARY = use_checkout()  # this checkout's package and library (workers inherit it)
import simjoin  # noqa: E402
import simjoin.dask as sjd  # noqa: E402


def now():
    return time.perf_counter()


def machine():
    cpu = platform.processor() or "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import distributed
    import pandas
    import pyarrow

    return (
        f"{cpu}, {os.cpu_count()} cores, {mem:.1f} GiB RAM, Linux {platform.release()}; "
        f"Python {platform.python_version()}, dask {dask.__version__}, distributed {distributed.__version__}, "
        f"pandas {pandas.__version__}, pyarrow {pyarrow.__version__}, simjoin {simjoin.__version__}"
    )


def load():
    return os.getloadavg()[0]


def uniform(n, d, chunk, seed):
    return da.random.default_rng(seed).random((n, d), chunks=(chunk, d))


def clustered(n, d, chunk, seed):
    """60% of the points in 8 Gaussian clusters of very different widths, 40% uniform."""

    def block(block_id, rows):
        rng = np.random.default_rng([seed, block_id[0]])
        centres = np.random.default_rng(seed).random((8, d)) * 0.8 + 0.1
        sigma = np.array([0.0005, 0.001, 0.002, 0.004, 0.008, 0.015, 0.03, 0.05])
        share = np.array([0.05, 0.05, 0.1, 0.1, 0.1, 0.2, 0.2, 0.2])
        x = rng.random((rows, d))
        m = int(rows * 0.6)
        c = rng.choice(8, size=m, p=share)
        x[:m] = centres[c] + sigma[c, None] * rng.standard_normal((m, d))
        return x

    chunks = [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])
    blocks = [da.from_delayed(dask.delayed(block)((i, 0), r), (r, d), dtype=np.float64) for i, r in enumerate(chunks)]
    return da.concatenate(blocks)


def task_times(ts):
    """Compute seconds of each join task (keys _leaf_join-* / _block-*) in a task stream."""
    out = []
    for t in ts.data:
        key = str(t.get("key"))
        if "_leaf_join" in key or "_block" in key:
            out.append(sum(s["stop"] - s["start"] for s in t.get("startstops", ()) if s.get("action") == "compute"))
    return np.array(out)


def local(X):
    """The dask array computed into the client, as an aligned C-contiguous array (arrays
    deserialised from distributed's frames can be unaligned, which the engine rejects)."""
    return np.require(X.compute(), requirements=["C", "A", "O"])


def ratio(v):
    v = np.asarray(v, dtype=float)
    return float(v.max() / v.mean()) if len(v) and v.mean() > 0 else float("nan")


def part_overhead(client, args, rows):
    n, d, eps = (200_000, 3, 0.02) if args.quick else (2_000_000, 3, 0.0134)
    X = uniform(n, d, n // 8, 1).persist()
    Xl = local(X)
    t = now()
    want = simjoin.self_join(Xl, eps)
    single = now() - t
    t = now()
    count = simjoin.self_join(Xl, eps, output="count")
    single_count = now() - t
    t = now()
    plan = sjd.plan(X, eps)
    t_plan = now() - t
    res = sjd.self_join(X, eps, plan=plan, threads=1)
    t = now()
    dcount = int(res.map_partitions(len).compute().sum())
    t_count = now() - t
    t = now()
    frame = res.compute()
    t_compute = now() - t
    got = frame[["i", "j"]].to_numpy()
    got = got[np.lexsort((got[:, 1], got[:, 0]))]
    exact = bool(len(got) == len(want) and np.array_equal(got, want.astype(np.int64)))
    del frame, got
    outdir = tempfile.mkdtemp(prefix="sj-dask-", dir=args.tmp)
    t = now()
    res.to_parquet(outdir, write_index=False)
    t_parquet = now() - t
    size = sum(os.path.getsize(os.path.join(outdir, f)) for f in os.listdir(outdir))
    shutil.rmtree(outdir)
    assert dcount == count == len(want) and exact, (dcount, count, len(want), exact)
    rows.append(dict(
        part="overhead", workload=f"uniform-{d}d", n=n, eps=eps, pairs=count, leaves=plan.n_leaves,
        tasks=plan.n_tasks, single_pairs_s=single, single_count_s=single_count, dask_plan_s=t_plan,
        dask_count_s=t_count, dask_compute_s=t_compute, dask_parquet_s=t_parquet, parquet_bytes=size,
        exact=exact, load=load(),
    ))
    print(rows[-1], flush=True)


def part_balance(client, args, rows):
    n, d, eps, parts = (200_000, 3, 0.004, 8) if args.quick else (1_000_000, 3, 0.0006, 16)
    X = clustered(n, d, n // 8, 2).persist()
    Xl = local(X)
    t = now()
    count = simjoin.self_join(Xl, eps, output="count")
    single_count = now() - t
    t = now()
    simjoin.self_join(Xl, eps)
    single = now() - t
    for name, kw in [("pair-aware (default)", {}), ("point quantiles only", dict(pair_cost=0.0, max_skew=1e9))]:
        t = now()
        plan = sjd.plan(X, eps, partitions=parts, **kw)
        t_plan = now() - t
        res = sjd.self_join(X, eps, plan=plan, threads=1)
        with get_task_stream(client) as ts:
            t = now()
            sizes = res.map_partitions(len).compute().to_numpy()
            wall = now() - t
        secs = task_times(ts)
        assert int(sizes.sum()) == count, (int(sizes.sum()), count)
        s = plan.stats
        rows.append(dict(
            part="balance", workload=f"clustered-{d}d", planner=name, n=n, eps=eps, pairs=count, partitions=parts,
            leaves=plan.n_leaves, tasks=plan.n_tasks, split_leaves=s["split_leaves"],
            est_max_mean_pairs=s["max_mean_pairs"], est_max_mean_cost=s["max_mean_cost"],
            max_mean_pairs=ratio(sizes), max_task_pairs=int(sizes.max()), max_mean_task_s=ratio(secs),
            max_task_s=float(secs.max()), sum_task_s=float(secs.sum()), halo_copies=s["estimated_halo_copies"],
            plan_s=t_plan, dask_count_s=wall, single_count_s=single_count, single_pairs_s=single, load=load(),
        ))
        print(rows[-1], flush=True)


def part_large(client, args, rows):
    n, d, eps = (500_000, 3, 0.02) if args.quick else (args.large_n, 3, args.large_eps)
    X = uniform(n, d, 1_000_000 if n > 4_000_000 else n // 4, 3).persist()
    Xl = local(X)
    t = now()
    count = simjoin.self_join(Xl, eps, output="count")
    single_count = now() - t
    del Xl
    outdir = tempfile.mkdtemp(prefix="sj-dask-large-", dir=args.tmp)
    t = now()
    plan = sjd.plan(X, eps)
    t_plan = now() - t
    res = sjd.self_join(X, eps, plan=plan, threads=1)
    t = now()
    res.to_parquet(outdir, write_index=False)
    t_write = now() - t
    import pyarrow.parquet as pq

    files = [os.path.join(outdir, f) for f in os.listdir(outdir) if f.endswith(".parquet")]
    written = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    size = sum(os.path.getsize(f) for f in files)
    shutil.rmtree(outdir)
    assert written == count, (written, count)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    rows.append(dict(
        part="large", workload=f"uniform-{d}d", n=n, eps=eps, pairs=count, leaves=plan.n_leaves, tasks=plan.n_tasks,
        est_max_mean_cost=plan.stats["max_mean_cost"], plan_s=t_plan, dask_parquet_s=t_write, parquet_bytes=size,
        pairs_per_s=count / t_write, single_count_s=single_count, single_pairs_bytes=8 * count,
        single_peak_bytes=16 * count, machine_bytes=mem, load=load(),
    ))
    print(rows[-1], flush=True)


PEAK_CHILD = """
import resource, sys, time
import numpy as np, simjoin
n, eps = int(sys.argv[1]), float(sys.argv[2])
X = np.random.default_rng(3).random((n, 3))
simjoin.self_join(X[:1000], eps)
import os
base = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")  # resident now
t = time.perf_counter()
p = simjoin.self_join(X, eps)
dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(len(p), dt, peak - base)
"""


def part_peak(client, args, rows):
    """The single-machine join's peak memory per pair, measured in a fresh process on a join
    that fits (the figure the large part's extrapolation uses)."""
    import subprocess

    n, eps = (200_000, 0.033) if args.quick else (2_000_000, 0.033)
    out = subprocess.run([sys.executable, "-c", PEAK_CHILD, str(n), str(eps)], capture_output=True, text=True,
                         check=True).stdout.split()
    pairs, secs, extra = int(out[0]), float(out[1]), int(out[2])
    rows.append(dict(part="peak", workload="uniform-3d", n=n, eps=eps, pairs=pairs, single_pairs_s=secs,
                     peak_bytes=extra, bytes_per_pair=extra / pairs, load=load()))
    print(rows[-1], flush=True)


def markdown(rows, args):
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"### Run of {when}", "", f"Machine: {machine()}.", f"Command: `python bench/dask_bench.py {' '.join(sys.argv[1:])}`", ""]
    ov = [r for r in rows if r["part"] == "overhead"]
    if ov:
        out += [
            "Overhead (same data, same cores: single machine = one process, engine on all cores; Dask = 2 worker",
            "processes x 1 engine thread). `count`: pairs counted per task (nothing sent back); `compute`: all pairs",
            "gathered into one pandas frame in the client (int64 i, j); `parquet`: written by the workers.",
            "",
            "| workload | n | eps | pairs | leaves/tasks | single pairs s | single count s | Dask plan s | Dask count s | Dask compute s | Dask parquet s (MB) | exact | load |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
        ]
        for r in ov:
            out.append(
                f"| {r['workload']} | {r['n']} | {r['eps']} | {r['pairs']} | {r['leaves']}/{r['tasks']} | "
                f"{r['single_pairs_s']:.2f} | {r['single_count_s']:.2f} | {r['dask_plan_s']:.2f} | {r['dask_count_s']:.2f} | "
                f"{r['dask_compute_s']:.2f} | {r['dask_parquet_s']:.2f} ({r['parquet_bytes'] / 1e6:.0f}) | {r['exact']} | {r['load']:.1f} |"
            )
        out.append("")
    bal = [r for r in rows if r["part"] == "balance"]
    if bal:
        r0 = bal[0]
        out += [
            f"Balance on clustered data ({r0['workload']}, n = {r0['n']}, eps = {r0['eps']}, {r0['pairs']} pairs; 60% of",
            "the points in 8 Gaussian clusters with sigma 0.0005 to 0.05, 40% uniform), `partitions` =",
            f"{r0['partitions']}, pairs counted per task. The default planner against one that cuts at point",
            "quantiles only (`pair_cost=0, max_skew=1e9`). Task seconds are the join tasks' compute times from",
            f"distributed's task stream. Single machine: count {r0['single_count_s']:.2f} s, pairs {r0['single_pairs_s']:.2f} s.",
            "",
            "| planner | leaves | tasks | blocked leaves | est. max/mean pairs | max/mean pairs | max task pairs | max/mean task s | max task s | sum task s | halo copies (est.) | plan s | Dask wall s | load |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in bal:
            out.append(
                f"| {r['planner']} | {r['leaves']} | {r['tasks']} | {r['split_leaves']} | {r['est_max_mean_pairs']:.2f} | "
                f"{r['max_mean_pairs']:.2f} | {r['max_task_pairs']} | {r['max_mean_task_s']:.2f} | {r['max_task_s']:.2f} | "
                f"{r['sum_task_s']:.1f} | {r['halo_copies']:.0f} | {r['plan_s']:.2f} | {r['dask_count_s']:.2f} | {r['load']:.1f} |"
            )
        out.append("")
    for r in [r for r in rows if r["part"] == "peak"]:
        out += [
            f"Single-machine peak memory: `simjoin.self_join` (pairs, sorted) on {r['workload']}, n = {r['n']},",
            f"eps = {r['eps']}: {r['pairs']} pairs in {r['single_pairs_s']:.1f} s, peak RSS {r['peak_bytes'] / 2**30:.2f} GiB above",
            f"the resident size before the call = **{r['bytes_per_pair']:.1f} bytes per pair** (the engine's result buffer, then",
            f"the (m, 2) uint32 copy NumPy returns). Load average: {r['load']:.1f}.",
            "",
        ]
    lg = [r for r in rows if r["part"] == "large"]
    for r in lg:
        gib = 2**30
        out += [
            f"Large: {r['workload']}, n = {r['n']}, eps = {r['eps']}: **{r['pairs']} pairs** written to Parquet by",
            f"the workers in {r['dask_parquet_s']:.0f} s ({r['pairs_per_s'] / 1e6:.1f} M pairs/s; planning {r['plan_s']:.1f} s;",
            f"{r['leaves']} leaves, {r['tasks']} tasks, estimated max/mean cost {r['est_max_mean_cost']:.2f}); files:",
            f"{r['parquet_bytes'] / gib:.1f} GiB; the row count read back from the Parquet footers equals the single-machine",
            f"`output=\"count\"` ({r['single_count_s']:.1f} s; counting materialises nothing). The single-machine",
            f"`simjoin.self_join` would return these pairs as an (m, 2) uint32 array of {r['single_pairs_bytes'] / gib:.1f} GiB,",
            f"after the engine's own result buffer of the same size: at the 16 bytes per pair measured above, a peak",
            f"of about {r['single_peak_bytes'] / gib:.1f} GiB on a machine with {r['machine_bytes'] / gib:.1f} GiB. It cannot finish here (not run,",
            f"so as not to exhaust a shared machine's memory). Load average after the run: {r['load']:.1f}.",
            "",
        ]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="overhead,balance,peak,large")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke test of the script)")
    ap.add_argument("--large-n", type=int, default=10_000_000)
    ap.add_argument("--large-eps", type=float, default=0.0207)
    ap.add_argument("--tmp", default=None, help="where Parquet output goes (deleted after measuring)")
    ap.add_argument("--out", default=None, help="append the results (markdown) to this file")
    ap.add_argument("--json", default=None, help="write the raw figures here")
    args = ap.parse_args()
    parts = args.parts.split(",")
    rows = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        for p in parts:
            {"overhead": part_overhead, "balance": part_balance, "peak": part_peak, "large": part_large}[p](
                client, args, rows)
    text = markdown(rows, args)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
