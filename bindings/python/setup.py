"""Builds simjoin's Rust C library with cargo and ships it inside the Python package.

The package's version is the Rust crate's (Cargo.toml). Set SIMJOIN_LIBRARY to an existing
libsimjoin.so to skip the cargo build and bundle that file instead (scripts/build-wheel.sh
does, for a wheel that installs without Rust). cargo's own progress is shown: on the
terminal pip runs from (pip hides a build's output unless -v, so it goes to /dev/tty where
there is one), else on standard error.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent  # the Rust crate: bindings/python -> repository root
LIBRARY = {"darwin": "libsimjoin.dylib", "win32": "simjoin.dll"}.get(sys.platform, "libsimjoin.so")


def crate_version():
    text = (ROOT / "Cargo.toml").read_text()
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if not match:
        raise RuntimeError(f"no version in {ROOT / 'Cargo.toml'}")
    return match.group(1)


def build_library():
    prebuilt = os.environ.get("SIMJOIN_LIBRARY")
    if prebuilt:
        return Path(prebuilt)
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    with progress_stream() as err:
        print(
            "simjoin: building the Rust library with cargo (the first build takes about 15 minutes on"
            " 2 cores; SIMJOIN_LIBRARY=path/to/libsimjoin.so skips it)",
            file=err,
            flush=True,
        )
        subprocess.run(
            [cargo, "build", "--release", "-p", "simjoin", "--lib"], cwd=ROOT, check=True, stderr=err
        )
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    return target / "release" / LIBRARY


def progress_stream():
    """Where cargo's progress goes: the controlling terminal when there is one (pip
    captures the build's own output), else standard error."""
    import contextlib

    if os.environ.get("SIMJOIN_BUILD_QUIET") != "1":
        try:
            return open("/dev/tty", "w")
        except OSError:
            pass
    return contextlib.nullcontext(sys.stderr)


class BuildWithCargo(build_py):
    def run(self):
        super().run()
        library = build_library()
        if not library.exists():
            raise RuntimeError(f"{library} not found after the cargo build")
        dest = Path(self.build_lib) / "simjoin"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(library, dest / LIBRARY)


class BinaryDistribution(Distribution):
    """The wheel holds a native library: mark it platform-specific."""

    def has_ext_modules(self):
        return True


commands = {"build_py": BuildWithCargo}
try:
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        """One wheel for every Python 3: the library is loaded with ctypes, not built against
        a Python ABI (py3-none-<platform>)."""

        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])

    commands["bdist_wheel"] = PlatformWheel
except ImportError:  # building without the wheel package: no wheel to tag
    pass

setup(
    version=crate_version(),
    cmdclass=commands,
    distclass=BinaryDistribution,
)
