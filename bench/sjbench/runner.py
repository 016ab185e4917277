"""Running one system on one (data, eps) with repeats and a per-run timeout.

Peers run in a worker process (sjbench.peers) that prints one JSON line per repetition;
simjoin runs as its CLI (`simjoin self-join DATA.npy --eps E --stats`), one process per
repetition, or through its Python bindings when they are installed.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = BENCH_DIR.parent

# A system stops repeating once its runs at one eps have taken this long in total (at least
# one run is always made): noise matters less for long runs, and the budget is 2 cores.
REPEAT_BUDGET_S = float("inf")


@dataclass
class Outcome:
    """What one system did on one (data, eps): every repetition, or why there is none."""

    status: str  # "ok", "timeout", "error" or "skipped"
    runs: list[dict] = field(default_factory=list)  # each: seconds, pairs (+ simjoin stats)
    message: str = ""

    @property
    def pairs(self) -> int | None:
        return self.runs[0]["pairs"] if self.runs else None


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def bindings_env() -> dict:
    """Lets a worker import simjoin's Python bindings from the source tree with the library
    cargo built, when they are not installed in the venv."""
    env = dict(os.environ)
    library = REPO_DIR / "target/release/libsimjoin.so"
    try:
        import importlib.util

        installed = importlib.util.find_spec("simjoin") is not None
    except ImportError:
        installed = False
    if not installed and library.exists():
        src = str(REPO_DIR / "bindings/python/src")
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("SIMJOIN_LIBRARY", str(library))
    return env


def run_peer(system: str, data: Path, eps: float, repeats: int, timeout: float) -> Outcome:
    """Runs a Python peer in a worker; each repetition must finish within `timeout` s."""
    cmd = [sys.executable, "-m", "sjbench.peers", system, str(data), repr(eps), str(repeats), repr(REPEAT_BUDGET_S)]
    env = bindings_env() if system == "simjoin-python" else None
    proc = subprocess.Popen(
        cmd, cwd=BENCH_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    runs: list[dict] = []
    try:
        while len(runs) < repeats:
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                return Outcome("timeout", runs, f"a run took longer than {timeout:g} s")
            if line is None:
                if proc.wait() == 0 and runs:
                    break  # the worker stopped early: its repeat budget was spent
                err = proc.stderr.read().strip().splitlines()
                return Outcome("error", runs, err[-1] if err else f"worker exited ({proc.poll()})")
            runs.append(json.loads(line))
        return Outcome("ok", runs)
    finally:
        _kill(proc)


# "pairs": simjoin materialises every pair in memory (as the peers do) and the CLI writes
# them to a scratch .npy after the timed join; "count": simjoin only counts (no peer can).
SIMJOIN_OUTPUT = "pairs"
VULKAN_WARMUP = True
SIMJOIN_PRECISION = None  # None: as stored (f64); "f32" joins in single precision (gpu mode)
# Joins run in one process, the last timed (`--repeat`): a long-lived caller's figure, the
# device open and the engine's kept buffers paid by the earlier ones (gpu mode sets 2).
IN_PROCESS_REPEAT = 1
PAIRS_SCRATCH = Path(tempfile.gettempdir()) / f"simjoin-bench-{os.getpid()}-pairs.npy"


def simjoin_command(binary: Path, data: Path, eps: float, backend: str, algorithm: str,
                    extra: list[str] | None = None) -> list[str]:  # fmt: skip
    cmd = [
        str(binary), "self-join", str(data), "--eps", repr(eps),
        "--backend", backend, "--algorithm", algorithm, "--stats", *(extra or []),
    ]  # fmt: skip
    if SIMJOIN_OUTPUT == "pairs":
        cmd += ["--output", str(PAIRS_SCRATCH)]
    if SIMJOIN_PRECISION:
        cmd += ["--precision", SIMJOIN_PRECISION]
    if IN_PROCESS_REPEAT > 1:
        cmd += ["--repeat", str(IN_PROCESS_REPEAT)]
    return cmd


def parse_stats(stdout: str) -> dict:
    """The one JSON object `simjoin ... --stats` prints on stdout."""
    start = stdout.find("{")
    if start < 0:
        raise ValueError(f"no JSON object in simjoin's output: {stdout[:200]!r}")
    stats = json.loads(stdout[start : stdout.rfind("}") + 1])
    for key in ("pairs", "seconds"):
        if key not in stats:
            raise ValueError(f"simjoin --stats output lacks {key!r}: {stats}")
    return stats


def run_simjoin_cli(
    binary: Path,
    data: Path,
    eps: float,
    repeats: int,
    timeout: float,
    backend: str = "cpu",
    algorithm: str = "auto",
    device: str | None = None,
    env_extra: dict | None = None,
    extra: list[str] | None = None,
) -> Outcome:
    """Runs the CLI `repeats` times. `seconds` is the join as simjoin reports it (index build
    to results in memory, file I/O excluded: the same span the peers are timed over);
    `wall` is the whole process, .npy load and Vulkan start-up included."""
    env = dict(os.environ)
    if device is not None:
        env["SIMJOIN_DEVICE"] = device
    env.update(env_extra or {})
    cmd = simjoin_command(binary, data, eps, backend, algorithm, extra)
    if backend == "gpu" and VULKAN_WARMUP and IN_PROCESS_REPEAT == 1:
        # One untimed run first: the driver's shader cache is cold in a fresh process tree,
        # and pipeline compilation is a one-off cost a long-lived process pays once.
        try:
            subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return Outcome("timeout", [], f"the warm-up run took longer than {timeout:g} s")
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return Outcome("timeout", runs, f"a run took longer than {timeout:g} s")
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            msg = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            return Outcome("error", runs, msg)
        try:
            stats = parse_stats(proc.stdout)
        except ValueError as e:
            return Outcome("error", runs, str(e))
        PAIRS_SCRATCH.unlink(missing_ok=True)
        # Sorted output: the time to every pair in memory in order is the join's and then
        # the in-memory sort's finish (the CLI writes the file after that, untimed).
        stats["join_seconds"] = stats["seconds"]
        stats["seconds"] += stats.get("sort_seconds", 0.0)
        stats["wall"] = wall
        runs.append(stats)
        if sum(r["seconds"] for r in runs) >= REPEAT_BUDGET_S:
            break
    return Outcome("ok", runs)


DEVICE_LINE = re.compile(r"^\s*\[(\d+)\]\s+(.*)\s+\((\w+)\),\s+Vulkan\s+(\S+)")


def parse_info(text: str) -> list[dict]:
    """Devices from `simjoin info`, whose lines read `  [0] NAME (KIND), Vulkan 1.3.x, driver ...`."""
    out = []
    for line in text.splitlines():
        m = DEVICE_LINE.match(line)
        if m:
            out.append({"index": int(m[1]), "name": m[2].strip(), "kind": m[3], "api_version": m[4].rstrip(",")})
    return out


def list_vulkan_devices(binary: Path, env_extra: dict | None = None) -> list[dict]:
    """Vulkan devices as `simjoin info` lists them: [{index, name, kind, api_version}]."""
    env = dict(os.environ, **(env_extra or {}))
    try:
        proc = subprocess.run([str(binary), "info"], capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_info(proc.stdout) if proc.returncode == 0 else []


BANDWIDTH_LINE = re.compile(r"^bandwidth on (.*): host->device ([0-9.]+) GB/s, device->host ([0-9.]+) GB/s \(([0-9]+) MiB", re.M)
SERIAL_LINE = re.compile(r"^serial round trip on .*: host->device ([0-9.]+) GB/s, device->host ([0-9.]+) GB/s", re.M)


def measure_bandwidth(binary: Path, device: str, mib: int = 256) -> dict | None:
    """Host <-> device copy bandwidth of one device (`simjoin info --bandwidth`), in GB/s:
    the bound on a GPU join's transfers. None when it cannot be measured."""
    try:
        proc = subprocess.run([str(binary), "info", "--bandwidth", str(mib), "--device", device],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = BANDWIDTH_LINE.search(proc.stdout)
    if proc.returncode != 0 or not m:
        return None
    out = {"device": m[1], "upload_gbps": float(m[2]), "download_gbps": float(m[3]), "mib": int(m[4])}
    serial = SERIAL_LINE.search(proc.stdout)
    if serial:  # the old figure: one copy, a wait, one thread reading
        out["serial_upload_gbps"], out["serial_download_gbps"] = float(serial[1]), float(serial[2])
    return out


def is_software(device: dict) -> bool:
    """lavapipe (llvmpipe) and other CPU-backed Vulkan implementations."""
    name = device.get("name", "").lower()
    return device.get("kind") == "cpu" or "llvmpipe" in name or "lavapipe" in name
