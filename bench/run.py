#!/usr/bin/env python3
"""simjoin benchmark harness: one command generates the workloads, runs simjoin and its
peers (scipy, scikit-learn, FAISS), checks that all agree on the pair count, and writes
bench/results/ (JSON, Markdown, PNG) and the generated part of BENCHMARKS.md.

    python3 bench/run.py                 # full comparison (~20 min on 2 cores)
    python3 bench/run.py --quick         # smoke test (~1 min)
    python3 bench/run.py gpu --device 0  # simjoin only on one Vulkan device, 2M and 10M points
    python3 bench/run.py lss --device 0  # the LSS paper's experiments: GPU LSS vs GPU grid join
    python3 bench/run.py lss --device lavapipe --scale 0.125 --max-n 64000  # reduced, software

The comparison mode creates bench/.venv and installs bench/requirements.txt on first use.
The gpu and lss modes need only numpy and run with whatever python3 starts them.
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv"


def in_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def ensure_venv() -> None:
    """Re-executes this script inside bench/.venv, creating it and installing the peers if
    the requirements changed since the last install."""
    python = VENV / "bin" / "python"
    if not python.exists():
        print("creating bench/.venv", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    req = HERE / "requirements.txt"
    stamp = VENV / ".requirements.sha256"
    digest = hashlib.sha256(req.read_bytes()).hexdigest()
    if not stamp.exists() or stamp.read_text() != digest:
        print("installing bench/requirements.txt into bench/.venv", file=sys.stderr)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(req)], check=True)
        stamp.write_text(digest)
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]])


if __name__ == "__main__":
    gpu_mode = len(sys.argv) > 1 and sys.argv[1] in ("gpu", "lss")
    if not gpu_mode and not in_venv() and not os.environ.get("SIMJOIN_BENCH_NO_VENV"):
        ensure_venv()
    sys.path.insert(0, str(HERE))
    from sjbench.harness import main

    sys.exit(main(sys.argv[1:]))
