"""The benchmarks measure this checkout: its Python package and its release library, built
here, not a simjoin installed earlier (a pip-installed copy carries the library of the day
it was installed, and silently measuring that one is easy: it happened).

`use_checkout()` before `import simjoin`; SIMJOIN_LIBRARY, when set, still names the library
(for A/B runs of two builds). Subprocesses inherit the choice through the environment.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use_checkout():
    """Builds the release library if needed, points the `simjoin` import and SIMJOIN_LIBRARY
    at this checkout, and returns a line naming the library and the commit it was built from."""
    if "SIMJOIN_LIBRARY" not in os.environ:
        subprocess.run(["cargo", "build", "--release", "--lib", "-q"], cwd=ROOT, check=True)
        os.environ["SIMJOIN_LIBRARY"] = os.path.join(ROOT, "target", "release", "libsimjoin.so")
    src = os.path.join(ROOT, "bindings", "python", "src")
    sys.path.insert(0, src)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [src, os.environ.get("PYTHONPATH")] if p)
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown commit"
    lib = os.path.relpath(os.environ["SIMJOIN_LIBRARY"], ROOT)
    return f"library `{lib}`, checkout {commit}"
