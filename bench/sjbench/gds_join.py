"""GDS-Join (Gowanlock & Karsin's CUDA self-join, the seed papers' own code) as a peer of
the gpu mode: built from an unmodified copy of its source (`../shared/peers/gds-join`) with
nvcc, once per (dimensions, precision), and run as `main DATA.csv EPS DIM 3`.

What is timed, per run:
- `reported`: the "Time:" GDS-Join prints (its batched search with the result on the host,
  plus its dimension reordering), which excludes its index build;
- `index`: its "Time to index (not counted in the time)";
- `seconds` = index + reported: the same span simjoin's `--stats` seconds cover (index
  build to every pair on the host); data import and CUDA start-up are outside both;
- `wall`: the whole process (CSV import and the GPU warm-up included).

Its pair count is ordered and includes each point with itself (TOTAL RESULT SET SIZE ON
HOST); it is turned into unique pairs i < j, (total - n) / 2, to compare with simjoin's.
Its distance test is sqrt(d^2) <= eps where simjoin's is exact, so points at exactly eps
may be counted differently: the harness reports the deviation instead of hiding it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np

from .runner import Outcome

# GDS-Join's README and the GPU-JOIN paper: index every dimension up to 6, else 6.
MAX_INDEXED = 6

TIME_INDEX = re.compile(r"Time to index \(not counted in the time\):\s*([0-9.eE+-]+)")
TIME_JOIN = re.compile(r"^Time:\s*([0-9.eE+-]+)", re.M)
TOTAL = re.compile(r"TOTAL RESULT SET SIZE ON HOST:\s*([0-9]+)")
# Its own phase lines ("Time to estimate batches: 0.01", "Time freeing memory: 0.2", ...).
PHASE = re.compile(r"^(Time (?:to |for |freeing ).*?):\s*([0-9.eE+-]+)\s*$", re.M)


def indexed_dims(dim: int) -> int:
    return min(dim, MAX_INDEXED)


def configure(src: Path, build: Path, dim: int, dtype: str, compute: int, defines: dict[str, str]) -> None:
    """Copies GDS-Join's sources into `build` and sets its compile-time parameters there
    (params.h: dimensions, indexed dimensions, coordinate type, any `defines`; the
    Makefile: the GPU's compute capability). The source folder is left as it is."""
    if build.exists():
        shutil.rmtree(build)
    # Plain copies (the peers' folder may be read-only; the build writes beside them).
    shutil.copytree(src, build, copy_function=shutil.copyfile)
    build.chmod(0o755)
    values = {"GPUNUMDIM": str(dim), "NUMINDEXEDDIM": str(indexed_dims(dim)), "DTYPE": dtype, **defines}
    params = (build / "params.h").read_text()
    for name, value in values.items():
        params, count = re.subn(rf"^#define {name}\b.*$", f"#define {name} {value}", params, flags=re.M)
        if count != 1:
            raise ValueError(f"GDS-Join's params.h has {count} definitions of {name}, expected 1")
    (build / "params.h").write_text(params)
    make = (build / "Makefile").read_text()
    make, count = re.subn(r"^COMPUTE_CAPABILITY\s*=.*$", f"COMPUTE_CAPABILITY = {compute}", make, flags=re.M)
    if count != 1:
        raise ValueError("GDS-Join's Makefile sets COMPUTE_CAPABILITY in an unexpected way")
    (build / "Makefile").write_text(make)


def build(src: Path, root: Path, dim: int, dtype: str, compute: int, defines: dict[str, str],
          log=print) -> Path:  # fmt: skip
    """The `main` binary for these parameters, built under `root` (reused when built
    before with the same parameters)."""
    tag = "-".join([f"d{dim}", dtype, f"sm{compute}", *(f"{k}{v}" for k, v in sorted(defines.items()))])
    folder = root / f"gds-join-{tag}"
    binary = folder / "main"
    if binary.exists():
        return binary
    configure(src, folder, dim, dtype, compute, defines)
    t0 = time.perf_counter()
    make = ["make", f"-j{os.cpu_count() or 2}"]
    proc = subprocess.run(make, cwd=folder, capture_output=True, text=True)
    note = ""
    if proc.returncode != 0 or not binary.exists():
        # Its Makefile asks for C++14, which CUDA 13's Thrust no longer accepts: the same
        # flags with C++17 (the sources are unchanged).
        subprocess.run(["make", "clean"], cwd=folder, capture_output=True)
        flags = "-std=c++17 -O3 -Xcompiler -fopenmp -lcuda -lineinfo"
        retry = subprocess.run([*make, f"FLAGS={flags}"], cwd=folder, capture_output=True, text=True)
        if retry.returncode != 0 or not binary.exists():
            tail = "\n".join((proc.stdout + proc.stderr + retry.stdout + retry.stderr).strip().splitlines()[-20:])
            raise RuntimeError(f"building GDS-Join ({tag}) failed, with its flags and with C++17:\n{tail}")
        note = " (with -std=c++17: its Makefile's C++14 did not build here)"
    log(f"built GDS-Join {tag} in {time.perf_counter() - t0:.0f} s{note}")
    return binary


def prebuild(src: Path, root: Path, dims: list[int], dtype: str, compute: int, defines: dict[str, str],
             log=print) -> None:  # fmt: skip
    """Builds every dimensions' binary at once (nvcc takes about a minute a build, and the
    device machine's time is short); a failure is logged and left to `system` to report."""
    from concurrent.futures import ThreadPoolExecutor

    def one(dim: int) -> None:
        try:
            build(src, root, dim, dtype, compute, defines, log)
        except (RuntimeError, ValueError, OSError) as e:
            log(str(e))

    with ThreadPoolExecutor(max_workers=max(len(dims), 1)) as pool:
        list(pool.map(one, dims))


def write_csv(x: np.ndarray, path: Path) -> None:
    """The points as GDS-Join reads them: one point a line, comma-separated, each value
    printed so that it parses back to the same double (pyarrow's shortest round-trip
    form where pyarrow is installed, which is much faster; else 17 significant digits)."""
    tmp = path.with_suffix(".tmp")
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv

        table = pa.table({f"c{j}": x[:, j] for j in range(x.shape[1])})
        pacsv.write_csv(table, tmp, pacsv.WriteOptions(include_header=False))
    except ImportError:
        np.savetxt(tmp, x, fmt="%.17g", delimiter=",")
    tmp.replace(path)


def parse_output(stdout: str, n: int) -> dict:
    """index / reported seconds and unique pairs from one run's standard output."""
    index, join, total = TIME_INDEX.search(stdout), TIME_JOIN.search(stdout), TOTAL.search(stdout)
    missing = [name for name, m in (("index time", index), ("time", join), ("result size", total)) if m is None]
    if missing:
        raise ValueError(f"GDS-Join's output lacks its {', '.join(missing)}: ...{stdout[-300:]!r}")
    ordered = int(total[1])
    if ordered < n or (ordered - n) % 2:
        raise ValueError(f"GDS-Join counted {ordered} ordered pairs for {n} points: not 2 x pairs + n")
    phases = [[name, float(v)] for name, v in PHASE.findall(stdout)]
    return {"index": float(index[1]), "reported": float(join[1]), "pairs": (ordered - n) // 2, "phases": phases}


def run(binary: Path, csv: Path, eps: float, dim: int, n: int, repeats: int, timeout: float) -> Outcome:
    """`repeats` runs of GDS-Join's GPU self-join (search mode 3) on one CSV file."""
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([str(binary), str(csv), repr(eps), str(dim), "3"], cwd=binary.parent,
                                  capture_output=True, text=True, timeout=timeout)  # fmt: skip
        except subprocess.TimeoutExpired:
            return Outcome("timeout", runs, f"a run took longer than {timeout:g} s")
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            return Outcome("error", runs, lines[-1] if lines else f"exit status {proc.returncode}")
        try:
            r = parse_output(proc.stdout, n)
        except ValueError as e:
            return Outcome("error", runs, str(e))
        runs.append({**r, "seconds": r["index"] + r["reported"], "wall": wall})
    return Outcome("ok", runs)


def system(src: Path, build_root: Path, dtype: str, compute: int, defines: dict[str, str], log=print):
    """A gpu-mode runner (data .npy, eps, repeats, timeout) -> Outcome: builds GDS-Join for
    the data's dimensions on first use and writes the CSV it reads beside the .npy (once
    per file; removed with it unless the data is kept)."""

    def run_on(data: Path, eps: float, repeats: int, timeout: float) -> Outcome:
        n, dim = np.load(data, mmap_mode="r").shape
        try:
            binary = build(src, build_root, dim, dtype, compute, defines, log)
        except (RuntimeError, ValueError, OSError) as e:
            log(str(e))
            return Outcome("error", [], str(e).splitlines()[0])
        csv = data.with_suffix(".csv")
        if not csv.exists() or csv.stat().st_mtime < data.stat().st_mtime:
            t0 = time.perf_counter()
            write_csv(np.load(data), csv)
            log(f"wrote {csv.name} for GDS-Join in {time.perf_counter() - t0:.1f} s")
        return run(binary, csv, eps, dim, n, repeats, timeout)

    return run_on
