"""Stopping and watching a call: every engine call runs on a worker thread with a
`simjoin_control`, while the calling thread waits in short steps, so that Ctrl-C (which
Python delivers to the main thread between those steps) cancels the engine's job at
once, and `progress=` is called from the caller's own thread, never from the engine's.
The call returns only after the job's threads have stopped."""
import ctypes
import sys
import threading
import time
from collections import namedtuple

from . import _native
from ._native import lib

Progress = namedtuple("Progress", "stage fraction pairs elapsed")
Progress.__doc__ = """How far a call has come: `stage` ("plan", "index", "join", "knn", "output"),
`fraction` of the stage's work done (0 to 1, in units of work, not of time), `pairs`
found so far, `elapsed` seconds since the call began."""

# How often the waiting thread wakes: Ctrl-C and progress are seen within this.
_STEP = 0.02
# How often `progress` is called.
_EVERY = 0.1


class _Bar:
    """`progress=True`: one line on stderr, rewritten in place."""

    def __init__(self):
        self.shown = False

    def __call__(self, p):
        width = 30
        filled = int(round(p.fraction * width))
        rate = p.pairs / p.elapsed if p.elapsed > 0 else 0.0
        left = ""
        if p.stage == "join" and 0.01 < p.fraction < 1.0:
            left = f", ~{p.elapsed * (1.0 - p.fraction) / p.fraction:.0f} s left"
        sys.stderr.write(
            f"\rsimjoin {p.stage:<6} [{'#' * filled}{'.' * (width - filled)}] {100 * p.fraction:5.1f}% "
            f"{p.pairs:,} pairs ({rate:,.0f}/s){left}   "
        )
        sys.stderr.flush()
        self.shown = True

    def close(self):
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _snapshot(handle):
    p = _native.Progress()
    if lib.simjoin_control_progress(handle, ctypes.byref(p)) != _native.OK:
        return None
    return Progress(p.stage.decode() if p.stage else "", float(p.fraction), int(p.pairs), float(p.elapsed))


def last_error():
    """This thread's last error message from the engine."""
    size = lib.simjoin_last_error_message(None, 0)
    buf = ctypes.create_string_buffer(size + 1)
    lib.simjoin_last_error_message(buf, size + 1)
    return buf.value.decode(errors="replace")


def run(call, opts, progress=None):
    """`call()` (an engine call reading `opts`, returning a status) with a new control in
    `opts.control`; returns the status and, on failure, the engine's message (read on the
    thread that made the call). Ctrl-C cancels the job and raises KeyboardInterrupt once
    it has stopped; an exception from `progress` cancels it too and is raised."""
    if progress is not None and progress is not False and progress is not True and not callable(progress):
        raise TypeError(f"progress must be a callable, True or None (got {progress!r})")
    handle = ctypes.c_void_p()
    status = lib.simjoin_control_new(ctypes.byref(handle))
    if status != _native.OK:
        return status, last_error()
    opts.control = handle.value
    report = _Bar() if progress is True else (progress or None)
    try:
        if threading.current_thread() is not threading.main_thread() and report is None:
            # No Ctrl-C reaches this thread and nothing is to be watched: run here.
            status = call()
            return status, (last_error() if status != _native.OK else "")
        outcome = {}
        # Whether the worker ran the call, or found it given up and never will: decided
        # under `gate`, so that a Ctrl-C inside `start()` (which waits for the thread and
        # can be interrupted after the thread was launched) cannot leave a call running
        # on with a freed control, out of the caller's reach.
        gate = threading.Lock()
        state = {"ran": False, "given_up": False}
        finished = threading.Event()

        def work():
            try:
                with gate:
                    if state["given_up"]:
                        return
                    state["ran"] = True
                status = call()
                outcome["status"] = status, (last_error() if status != _native.OK else "")
            finally:
                finished.set()

        worker = threading.Thread(target=work, name="simjoin-call", daemon=True)
        interrupted = None
        last = 0.0
        try:
            worker.start()
            while not finished.is_set():
                worker.join(_STEP)
                if report is not None and not finished.is_set():
                    now = time.monotonic()
                    if now - last >= _EVERY:
                        last = now
                        p = _snapshot(handle)
                        if p is not None:
                            report(p)
        except BaseException as e:  # KeyboardInterrupt, or the progress callable's error
            interrupted = e
            lib.simjoin_control_cancel(handle)
        # The job stops within milliseconds once cancelled; wait for it (a second Ctrl-C
        # must not leave it running on memory the caller is about to free). A worker that
        # has not reached the call yet is told never to.
        while True:
            try:
                with gate:
                    state["given_up"] = interrupted is not None
                    running = state["ran"] or interrupted is None
                if running:
                    finished.wait()
                break
            except KeyboardInterrupt:
                lib.simjoin_control_cancel(handle)
                interrupted = interrupted or KeyboardInterrupt()
        if interrupted is not None:
            raise interrupted
        if report is not None:
            p = _snapshot(handle)
            if p is not None:
                report(p)
        return outcome["status"]
    finally:
        if isinstance(report, _Bar):
            report.close()
        opts.control = None
        lib.simjoin_control_free(handle)
