"""Stopping and watching calls from Python: Ctrl-C (SIGINT) during a long join, kNN or
DBSCAN raises KeyboardInterrupt within 100 ms, leaves no engine thread running (measured
from the threads' CPU time) and the next join as fast as before; progress= is called
from the calling thread with growing fractions and every pair counted, True draws a bar,
and an exception from it stops the call."""
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import simjoin

# In 32-D at eps 0.5 no two of these uniform points are within eps (expected pairs ~1e-6)
# but nothing is pruned: the join compares nearly every pair, for seconds.
N, D, EPS = 200_000, 32, 0.5


@pytest.fixture(scope="module")
def far_apart():
    return np.random.default_rng(1).random((N, D), dtype=np.float32)


def _worker_ticks():
    """CPU ticks of this process's engine worker threads (named simjoin-cpu-*)."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            if not (task / "comm").read_text().startswith("simjoin"):
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def _assert_idle():
    time.sleep(0.03)
    before = _worker_ticks()
    time.sleep(0.3)
    assert _worker_ticks() - before <= 2, "an engine thread kept running after the call returned"


def _small_join_seconds():
    X = np.random.default_rng(2).random((20_000, 3))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        simjoin.self_join(X, 0.02, backend="cpu")
        best = min(best, time.perf_counter() - t)
    return best


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt during the test, as at an interactive prompt. A
    Python started with SIGINT ignored (launched with `&` from a script, as CI may be)
    inherits SIG_IGN and installs no handler of its own: the simulated Ctrl-C would then
    be dropped and the call run to its end, which is what such a process asked for but
    not what these tests measure."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_after(seconds):
    sent = {}

    def fire():
        sent["at"] = time.perf_counter()
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(seconds, fire)
    timer.start()
    return sent, timer


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="SIGINT goes to the main thread")
@pytest.mark.parametrize(
    "call",
    [
        lambda X: simjoin.self_join(X, EPS, backend="cpu"),
        lambda X: simjoin.self_join(X, EPS, backend="cpu", output="count"),
        lambda X: simjoin.join(X[: N // 2], X[N // 2 :], EPS, backend="cpu", output="csr"),
        lambda X: simjoin.neighbour_counts(X, EPS, backend="cpu"),
        lambda X: simjoin.knn(X, 10, backend="cpu", algorithm="brute"),
        lambda X: simjoin.dbscan(X, EPS, 5, backend="cpu"),
    ],
    ids=["self_join", "count", "join_csr", "neighbour_counts", "knn", "dbscan"],
)
def test_ctrl_c_stops_the_call_within_100_ms(far_apart, call, ctrl_c_raises):
    before = _small_join_seconds()
    sent, timer = _interrupt_after(0.3)
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        call(far_apart)
    raised = time.perf_counter()
    timer.join()
    assert raised - start > 0.25, "the call ended before the interrupt"
    latency = raised - sent["at"]
    assert latency < 0.1, f"KeyboardInterrupt {latency * 1e3:.0f} ms after SIGINT"
    _assert_idle()
    after = _small_join_seconds()
    assert after < 2 * before + 0.02, f"next join {after:.4f} s against {before:.4f} s before"


@pytest.mark.parametrize("launched", [False, True], ids=["before_launch", "after_launch"])
def test_ctrl_c_inside_the_worker_start_leaves_nothing_running(far_apart, monkeypatch, launched):
    """A Ctrl-C that lands in `Thread.start()` (which waits for the new thread, and can be
    interrupted before or after launching it): the call is stopped or never made, and
    nothing runs on after the KeyboardInterrupt."""
    real = threading.Thread.start

    def interrupted_start(self):
        if launched:
            real(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", interrupted_start)
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        simjoin.self_join(far_apart, EPS, backend="cpu")
    monkeypatch.undo()
    assert time.perf_counter() - start < 0.5
    _assert_idle()


def test_progress_is_called_with_growing_fractions_and_every_pair():
    X = np.random.default_rng(3).random((400_000, 2))
    seen = []
    want = simjoin.self_join(X, 0.004, backend="cpu", output="count")
    got = simjoin.self_join(X, 0.004, backend="cpu", output="count", progress=seen.append)
    assert got == want > 1_000_000
    assert seen, "progress was never called"
    assert all(isinstance(p, simjoin.Progress) for p in seen)
    assert all(0.0 <= p.fraction <= 1.0 for p in seen)
    joins = [p for p in seen if p.stage == "join"]
    assert all(a.fraction <= b.fraction and a.pairs <= b.pairs for a, b in zip(joins, joins[1:]))
    # The last report, after the join: all of its work and every pair.
    assert seen[-1].stage == "join" and seen[-1].fraction == 1.0 and seen[-1].pairs == want
    # Called from this thread, not the engine's.
    threads = []
    simjoin.self_join(X[:1000], 0.01, backend="cpu", progress=lambda p: threads.append(threading.get_ident()))
    assert set(threads) == {threading.get_ident()}


def test_progress_bar_and_a_failing_callback(far_apart, capsys):
    X = np.random.default_rng(4).random((300_000, 2))
    simjoin.self_join(X, 0.004, backend="cpu", progress=True)
    err = capsys.readouterr().err
    assert "simjoin join" in err and "100.0%" in err and "pairs" in err

    class Stop(Exception):
        pass

    def stop(p):
        if p.elapsed > 0.2:
            raise Stop

    start = time.perf_counter()
    with pytest.raises(Stop):
        simjoin.self_join(far_apart, EPS, backend="cpu", progress=stop)
    assert time.perf_counter() - start < 0.6
    _assert_idle()
    with pytest.raises(TypeError):
        simjoin.self_join(X, 0.01, progress="yes")


def test_calls_from_other_threads_still_work():
    X = np.random.default_rng(5).random((2000, 2))
    want = simjoin.self_join(X, 0.02, backend="cpu")
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("pairs", simjoin.self_join(X, 0.02, backend="cpu")))
    t.start()
    t.join()
    np.testing.assert_array_equal(out["pairs"], want)
    with pytest.raises(simjoin.InvalidArgumentError, match="eps"):
        simjoin.self_join(X, -1.0)
