"""The source build (`pip install ./bindings/python`) shows cargo's progress: pip hides a
build's output unless -v, so setup.py sends cargo's stderr to the terminal pip runs from
(/dev/tty), and to standard error where there is no terminal. Checked with a stand-in
cargo, under a pseudo-terminal (`script`) and without one (`setsid`)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[1] / "setup.py"

RUNNER = """
import sys
src = open(sys.argv[1]).read().split('class BuildWithCargo')[0]
g = {'__file__': sys.argv[1], '__name__': 'setup_under_test'}
exec(src, g)
g['build_library']()
"""


@pytest.fixture
def fake_cargo(tmp_path):
    cargo = tmp_path / "cargo"
    cargo.write_text('#!/bin/sh\necho "fake cargo $*" >&2\n')
    cargo.chmod(0o755)
    (tmp_path / "run.py").write_text(RUNNER)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    env.pop("SIMJOIN_LIBRARY", None)
    env.pop("SIMJOIN_BUILD_QUIET", None)
    return tmp_path, env


@pytest.mark.skipif(shutil.which("script") is None, reason="needs util-linux's script")
def test_progress_reaches_the_terminal(fake_cargo):
    tmp, env = fake_cargo
    err = tmp / "stderr.txt"
    cmd = f"{sys.executable} {tmp / 'run.py'} {SETUP} 2>{err}"
    out = subprocess.run(["script", "-qc", cmd, "/dev/null"], env=env, capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert "building the Rust library with cargo" in out.stdout, out
    assert "fake cargo build --release -p simjoin --lib" in out.stdout, out
    # Through the terminal, not the captured stream.
    assert err.read_text() == ""


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid")
def test_progress_goes_to_stderr_without_a_terminal(fake_cargo):
    tmp, env = fake_cargo
    out = subprocess.run(["setsid", sys.executable, str(tmp / "run.py"), str(SETUP)], env=env,
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out
    assert "building the Rust library with cargo" in out.stderr
    assert "fake cargo build --release -p simjoin --lib" in out.stderr
