"""Tests of the harness's own logic: that every peer's count is normalised to the same
unique-pair semantics (duplicates and points exactly eps apart included), that eps chosen
by sampling gives about the asked selectivity, and that the runners report timeouts,
errors and simjoin's --stats faithfully. Run: bench/.venv/bin/python -m pytest bench/tests
"""

import json
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sjbench import peers, report, workloads as wl  # noqa: E402
from sjbench.harness import System, check_agreement, median_phases, summarise  # noqa: E402
from sjbench.runner import Outcome, parse_stats, run_peer, run_simjoin_cli  # noqa: E402


def brute_pairs(x: np.ndarray, eps: float) -> int:
    """Unique pairs with squared distance <= eps^2, in f64, by brute force."""
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    return int(np.count_nonzero(np.triu(d2 <= eps * eps, k=1)))


def boundary_data() -> np.ndarray:
    """Integer grid points (exact in f32 and f64), so many pairs are exactly eps = 1 apart,
    plus duplicated points, plus clusters of random points."""
    grid = np.array([[i, j] for i in range(6) for j in range(6)], dtype=np.float64)
    dups = grid[:5].copy()
    rng = np.random.default_rng(1)
    noise = rng.uniform(0, 5, size=(60, 2)).astype(np.float32).astype(np.float64)
    return np.ascontiguousarray(np.vstack([grid, dups, noise]))


@pytest.mark.parametrize("system", peers.PEERS)
def test_peer_counts_match_brute_force_on_boundary_data(system):
    x = boundary_data()
    for eps in (1.0, 2.0, 0.5):
        _, pairs = peers.timed(system, x, eps)
        assert pairs == brute_pairs(x, eps), (system, eps)


def test_faiss_radius_needs_nextafter():
    # Without nextafter FAISS's strict `<` drops the pairs exactly eps apart: the test
    # above would fail, so it does check the adjustment.
    x32 = boundary_data().astype(np.float32)
    import faiss

    index = faiss.IndexFlatL2(2)
    index.add(x32)
    lims, _, labels = index.range_search(x32, 1.0)
    assert peers.faiss_count(lims, labels) < brute_pairs(x32.astype(np.float64), 1.0)
    assert peers.faiss_radius(1.0) > np.float32(1.0)


def test_generated_values_are_f32_exact_and_in_range():
    for w in wl.WORKLOADS.values():
        x = wl.generate(w, 2000)
        assert x.dtype == np.float64 and x.shape == (2000, w.dim) and x.flags.c_contiguous
        assert np.array_equal(x, x.astype(np.float32).astype(np.float64))
        if w.family == "uniform":
            assert x.min() >= 0 and x.max() <= 100
        if w.family == "exponential":
            assert x.min() >= 0 and x.max() <= 1 and abs(x.mean() - 1 / 40) < 0.003
    a = wl.generate(wl.WORKLOADS["uniform-2d"], 100, seed=3)
    assert np.array_equal(a, wl.generate(wl.WORKLOADS["uniform-2d"], 100, seed=3))


@pytest.mark.parametrize("name", ["uniform-3d", "expo-16d", "clusters-4d"])
def test_choose_eps_gives_about_the_target_selectivity(name):
    from scipy.spatial import cKDTree

    x = wl.generate(wl.WORKLOADS[name], 20_000)
    targets = [1, 10, 50]
    eps = wl.choose_eps(x, targets, sample=400)
    assert eps == sorted(eps) and len(eps) == 3
    tree = cKDTree(x)
    for e, t in zip(eps, targets):
        s = wl.selectivity(len(tree.query_pairs(e, output_type="ndarray")), len(x))
        assert t / 1.6 < s < t * 1.6, (name, e, t, s)


def test_run_peer_reports_timeout_and_repeats(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, wl.generate(wl.WORKLOADS["uniform-2d"], 2000))
    ok = run_peer("scipy-ckdtree", path, 1.0, 3, timeout=60)
    assert ok.status == "ok" and len(ok.runs) == 3 and len({r["pairs"] for r in ok.runs}) == 1
    # Importing scipy alone takes longer than 1 ms.
    slow = run_peer("scipy-ckdtree", path, 1.0, 1, timeout=0.001)
    assert slow.status == "timeout" and not slow.runs


def fake_simjoin(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "simjoin"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_simjoin_runner_parses_stats(tmp_path):
    stats = {"pairs": 12, "seconds": 0.5, "backend": "cpu", "device": "cpu (2 threads)",
             "algorithm": "grid", "batches": 1, "phases": [["index", 0.1], ["join", 0.4]]}  # fmt: skip
    binary = fake_simjoin(tmp_path, f"echo 'progress on stdout'\necho '{json.dumps(stats)}'\n")
    out = run_simjoin_cli(binary, tmp_path / "x.npy", 0.5, 2, timeout=30)
    assert out.status == "ok" and len(out.runs) == 2
    row = summarise(out)
    assert row["pairs"] == 12 and row["median"] == 0.5 and row["algorithm"] == "grid"
    assert row["phases"] == [["index", 0.1], ["join", 0.4]] and row["wall_median"] > 0


def test_simjoin_runner_reports_errors_and_timeouts(tmp_path):
    failing = fake_simjoin(tmp_path, "echo 'error: no Vulkan device found' >&2\nexit 3\n")
    out = run_simjoin_cli(failing, tmp_path / "x.npy", 0.5, 1, timeout=30)
    assert out.status == "error" and "no Vulkan device" in out.message
    hanging = fake_simjoin(tmp_path, "sleep 5\n")
    assert run_simjoin_cli(hanging, tmp_path / "x.npy", 0.5, 1, timeout=0.2).status == "timeout"
    with pytest.raises(ValueError):
        parse_stats('{"seconds": 1.0}')


def test_median_phases_accepts_every_shape():
    assert median_phases([[["a", 1.0]], [["a", 3.0]], [["a", 2.0]]]) == [["a", 2.0]]
    assert median_phases([{"a": 1.0, "b": 2.0}]) == [["a", 1.0], ["b", 2.0]]
    assert median_phases([[{"name": "a", "seconds": 1.5}]]) == [["a", 1.5]]


def row(pairs, median=1.0):
    return {"status": "ok", "pairs": pairs, "median": median, "times": [median]}


def systems(*keys):
    return [System(k, k, k.startswith("simjoin"), k != "faiss-flat-range", None) for k in keys]


def test_agreement_is_exact_except_for_faiss():
    rows = {"simjoin-cpu": row(100), "scipy-ckdtree": row(100), "sklearn-radius-graph": row(101),
            "faiss-flat-range": row(99)}  # fmt: skip
    ref = check_agreement(rows, systems(*rows), tolerance=0.02)
    assert ref == 100
    assert rows["simjoin-cpu"]["agrees"] and rows["faiss-flat-range"]["agrees"]
    assert rows["sklearn-radius-graph"]["agrees"] is False
    rows = {"simjoin-cpu": row(100), "scipy-ckdtree": row(90)}
    check_agreement(rows, systems(*rows), tolerance=0.02)
    assert rows["simjoin-cpu"]["agrees"] is False


def test_changing_pair_count_between_repeats_is_an_error():
    out = Outcome("ok", [{"seconds": 1, "pairs": 5}, {"seconds": 1, "pairs": 6}])
    assert summarise(out)["status"] == "error"


def test_speedup_uses_fastest_agreeing_peer_and_only_correct_simjoin():
    point = {"systems": {"simjoin-cpu": dict(row(10, 0.5), agrees=True),
                         "scipy-ckdtree": dict(row(10, 2.0), agrees=True),
                         "faiss-flat-range": dict(row(10, 1.0), agrees=True),
                         "sklearn-radius-graph": dict(row(11, 0.1), agrees=False)}}  # fmt: skip
    peer_keys = ["scipy-ckdtree", "faiss-flat-range", "sklearn-radius-graph"]
    assert report.peers_of(point, peer_keys) == ("faiss-flat-range", 1.0)
    assert report.speedup(point, "simjoin-cpu", peer_keys) == pytest.approx(2.0)
    point["systems"]["simjoin-cpu"]["agrees"] = False
    assert report.speedup(point, "simjoin-cpu", peer_keys) is None


def test_report_rewrites_only_the_generated_block(tmp_path):
    point = {"eps": 0.5, "pairs": 10, "selectivity": 2.0,
             "systems": {"simjoin-cpu": dict(row(10, 0.5), agrees=True, deviation=0),
                         "scipy-ckdtree": dict(row(10, 2.0), agrees=True, deviation=0),
                         "faiss-flat-range": {"status": "timeout", "message": "", "median": None, "pairs": None, "times": []}}}  # fmt: skip
    results = {
        "machine": {"date_utc": "d", "host": "h", "cpu": "c", "cores": 2, "memory_gib": 1, "os": "o",
                    "simjoin_commit": "abc", "versions": {}, "vulkan_devices": []},
        "options": {"command": "cmd", "repeats": 3, "timeout_s": 60, "faiss_tolerance": 1e-3},
        "elapsed_s": 1.0,
        "systems": {"simjoin-cpu": "simjoin CPU", "scipy-ckdtree": "scipy", "faiss-flat-range": "FAISS"},
        "suites": {"main": [{"workload": "uniform-2d", "family": "uniform", "dim": 2, "n": 20,
                             "description": "uniform", "source": "GPU-SJ", "points": [point]}]},
    }  # fmt: skip
    md = tmp_path / "BENCHMARKS.md"
    md.write_text(f"# Intro\n\n{report.BEGIN}\nold\n{report.END}\n\n## Reading\nhand-written\n")
    out = tmp_path / "results"
    out.mkdir()
    report.write_report(results, out, md)
    text = md.read_text()
    assert text.startswith("# Intro") and text.endswith("## Reading\nhand-written\n")
    assert "old" not in text and "**4.00x**" in text and "timeout (>60 s)" in text
    assert (out / "uniform-2d.png").stat().st_size > 0 and (out / "speedup.png").exists()


def test_repeat_budget_cuts_repeats_of_long_runs(tmp_path, monkeypatch):
    from sjbench import runner

    binary = fake_simjoin(tmp_path, """echo '{"pairs": 1, "seconds": 5.0}'\n""")
    monkeypatch.setattr(runner, "REPEAT_BUDGET_S", 9.0)
    assert len(run_simjoin_cli(binary, tmp_path / "x.npy", 0.5, 5, timeout=30).runs) == 2
    path = tmp_path / "x.npy"
    np.save(path, wl.generate(wl.WORKLOADS["uniform-2d"], 500))
    monkeypatch.setattr(runner, "REPEAT_BUDGET_S", 0.0)
    out = run_peer("scipy-ckdtree", path, 1.0, 3, timeout=60)
    assert out.status == "ok" and len(out.runs) == 1


def test_parse_info_reads_device_lines():
    from sjbench.runner import is_software, parse_info

    text = """simjoin 0.1.0
Vulkan devices:
  [0] NVIDIA H100 80GB HBM3 (discrete), Vulkan 1.4.312, driver NVIDIA 580.159.4
      queue families: ...
  [1] llvmpipe (LLVM 15.0.6, 256 bits) (cpu), Vulkan 1.3.255, driver llvmpipe Mesa 23.2.1
CPU: 2 threads
"""
    devs = parse_info(text)
    assert [d["index"] for d in devs] == [0, 1]
    assert devs[0]["name"] == "NVIDIA H100 80GB HBM3" and devs[0]["kind"] == "discrete"
    assert devs[1]["name"] == "llvmpipe (LLVM 15.0.6, 256 bits)" and is_software(devs[1])
    assert not is_software(devs[0]) and parse_info("Vulkan devices: none found") == []


SIMJOIN_BIN = Path(__file__).resolve().parents[2] / "target/release/simjoin"


@pytest.mark.skipif(not SIMJOIN_BIN.exists(), reason="build the CLI: cargo build --release --bin simjoin")
@pytest.mark.parametrize("output", ["pairs", "count"])
def test_real_simjoin_cli_agrees_with_brute_force_through_the_runner(tmp_path, monkeypatch, output):
    from sjbench import runner

    monkeypatch.setattr(runner, "SIMJOIN_OUTPUT", output)
    x = boundary_data()
    path = tmp_path / "x.npy"
    np.save(path, x)
    for eps in (1.0, 2.0):
        out = run_simjoin_cli(SIMJOIN_BIN, path, eps, 1, timeout=60, backend="cpu")
        assert out.status == "ok", out.message
        assert out.pairs == brute_pairs(x, eps)
        assert out.runs[0]["backend"] == "cpu" and out.runs[0]["seconds"] > 0
    assert not runner.PAIRS_SCRATCH.exists()


def test_gpu_mode_needs_numpy_only_and_reports_phases(tmp_path, monkeypatch):
    """The device machine has numpy but not the venv: gpu mode must not import the peers."""
    from sjbench import harness

    for mod in ("scipy", "sklearn", "faiss", "matplotlib"):
        monkeypatch.setitem(sys.modules, mod, None)  # importing it now raises ImportError
    stats = {"pairs": 7, "seconds": 0.25, "backend": "vulkan", "device": "Fake GPU", "algorithm": "grid",
             "batches": 3, "phases": [{"name": "index build", "seconds": 0.05}, {"name": "search kernels", "seconds": 0.2}],
             "bytes_to_device": 2_000_000, "bytes_from_device": 500_000,
             "notes": ["overlap: (GPU search 0.2 s over 3 dispatches + GPU copies 0.01 s + host reads and assembly 0.05 s) / batch loop 0.21 s = 1.24; 2.5 batches in flight on average; 1 compute queue(s)"]}  # fmt: skip
    binary = fake_simjoin(tmp_path, f"""if [ "$1" = info ]; then
  echo 'Vulkan devices:'; echo '  [0] Fake GPU (discrete), Vulkan 1.3.0, driver x'
else
  [ "$SIMJOIN_DEVICE" = 0 ] || {{ echo "device not passed" >&2; exit 2; }}
  echo '{json.dumps(stats)}'
fi
""")
    out = tmp_path / "out"
    rc = harness.main(["gpu", "--device", "0", "--simjoin-bin", str(binary), "--no-build", "--sizes", "500",
                       "--workloads", "uniform-2d", "--selectivities", "1,10", "--repeats", "2",
                       "--out", str(out), "--data-dir", str(tmp_path / "data")])  # fmt: skip
    assert rc == 0
    result = json.loads((out / "gpu-fake-gpu.json").read_text())
    assert result["device"]["name"] == "Fake GPU"
    rows = [p["systems"]["simjoin-gpu"] for p in result["workloads"][0]["points"]]
    assert len(rows) == 2 and all(r["status"] == "ok" and r["batches"] == 3 for r in rows)
    assert rows[0]["phases"] == [["index build", 0.05], ["search kernels", 0.2]]
    assert rows[0]["bytes_to_device"] == 2_000_000 and rows[0]["bytes_from_device"] == 500_000
    md = (out / "gpu-fake-gpu.md").read_text()
    assert "search kernels 0.2" in md
    assert "| 2 / 0.5 |  |  | 1.24 |" in md  # no bandwidth measured: no bound


def test_lss_suite_points_scale_and_report():
    """The lss suite's points: the paper's sizes at scale 1, shrunk by --scale and --max-n;
    its report names a software device as such."""
    from sjbench.harness import parse_args
    from sjbench.lss_mode import experiments, lss_markdown

    full = experiments(parse_args(["lss", "--device", "0"]))
    assert [p["n"] for p in full if p["experiment"] == "n"] == [1_000, 4_000, 16_000, 64_000, 256_000, 1_000_000]
    assert {p["n"] for p in full if p["experiment"] == "eps"} == {256_000}
    assert [p["eps"] for p in full if p["experiment"] == "eps"][0] == 0.01
    small = experiments(parse_args(["lss", "--device", "lavapipe", "--scale", "0.0625", "--max-n", "16000"]))
    assert max(p["n"] for p in small if p["experiment"] == "n") == 16_000
    assert {p["n"] for p in small if p["experiment"] == "lists"} == {4_000}
    row = {"status": "ok", "median": 1.0, "pairs": 0, "agrees": True, "notes": ["3 Z-order lists"]}
    results = {
        "machine": {"date_utc": "d", "host": "h", "cpu": "c", "cores": 2, "simjoin_commit": "x",
                    "load_average_start": [1, 1, 1]},
        "device": {"name": "llvmpipe"}, "software": True,
        "options": {"scale": 0.0625, "max_n": 16000, "repeats": 1},
        "points": [{"experiment": "n", "n": 1000, "eps": 0.1, "lists": [None],
                    "systems": {"lss": row, "grid": dict(row, median=2.0)}}],
    }  # fmt: skip
    md = lss_markdown(results)
    assert "not GPU performance" in md and "| 1,000 | 0.1 | 0 | 1 | 2 | 2.00 |" in md


# GDS-Join's output for one mode-3 run, in the format of its printf calls (main.cu, GPU.cu).
GDS_OUTPUT = """
Dataset file: data.csv
Epsilon: 0.500000
Number of dimensions (NDIM): 2

*****************
Warming up GPU:
*****************

Grid: total cells (including empty) 400
Time to index (not counted in the time): 0.012500
Time to estimate batches: 0.002000
Time to allocate pinned memory for results (tid: 0): 0.031000
TOTAL RESULT SET SIZE ON HOST:  {total}
Time to launch kernel and execute everything (get results etc.) except freeing memory: 0.090000
Time freeing memory: 0.004000
Time: 0.125000
"""


def test_gds_join_output_parsed_into_unique_pairs_and_phases():
    from sjbench import gds_join

    r = gds_join.parse_output(GDS_OUTPUT.format(total=1000 + 2 * 37), 1000)
    assert r["pairs"] == 37 and r["index"] == 0.0125 and r["reported"] == 0.125
    assert ["Time to estimate batches", 0.002] in r["phases"] and ["Time freeing memory", 0.004] in r["phases"]
    with pytest.raises(ValueError, match="ordered pairs"):
        gds_join.parse_output(GDS_OUTPUT.format(total=1001), 1000)  # not n + 2 x pairs
    with pytest.raises(ValueError, match="index time"):
        gds_join.parse_output(GDS_OUTPUT.format(total=1000).replace("Time to index", "Index"), 1000)


PARAMS_H = """//Number of dimensions of the data (n)
#define GPUNUMDIM 100
#define NUMINDEXEDDIM 6
#define DTYPE double
#define STAMP 0
"""


def fake_gds_source(tmp_path: Path) -> Path:
    """A folder shaped like GDS-Join's sources whose `make` builds a `main` that joins the
    CSV it is given by brute force (in numpy) and prints GDS-Join's output format."""
    src = tmp_path / "gds-src"
    src.mkdir()
    (src / "params.h").write_text(PARAMS_H)
    (src / "Makefile").write_text("COMPUTE_CAPABILITY = 75\nall:\n\tcp fake_main.py main\n\tchmod +x main\n")
    body = GDS_OUTPUT.replace("{total}", "%d")
    (src / "fake_main.py").write_text(f"""#!{sys.executable}
import re, sys
import numpy as np
params = open("params.h").read()
assert re.search(r"#define GPUNUMDIM {{}}\\b".format(sys.argv[3]), params), "built for other dimensions"
assert "COMPUTE_CAPABILITY = 90" in open("Makefile").read()
x = np.loadtxt(sys.argv[1], delimiter=",", ndmin=2)
eps = float(sys.argv[2])
d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
print({body!r} % int(np.count_nonzero(d2 <= eps * eps)))
""")
    # Read-only, as ../shared/peers is: the build must work on its own copy.
    for f in src.iterdir():
        f.chmod(0o444)
    src.chmod(0o555)
    return src


def test_gpu_mode_runs_gds_join_beside_simjoin(tmp_path, monkeypatch):
    """--gds-join: built once per dimensions with its parameters set in a copy of its
    sources, handed the same points as CSV (parsed back to the same doubles), its count
    normalised to unique pairs and checked, and both of its times recorded with the ratios."""
    from sjbench import harness

    def stats_for(pairs: int) -> str:
        return json.dumps({"pairs": pairs, "seconds": 0.05, "backend": "vulkan", "device": "Fake GPU",
                           "algorithm": "grid", "batches": 1, "phases": []})  # fmt: skip

    # The fake simjoin counts exactly, like the real one, so that agreement means something.
    binary = fake_simjoin(tmp_path, f"""if [ "$1" = info ]; then
  echo '  [0] Fake GPU (discrete), Vulkan 1.3.0, driver x'
else
  exec {sys.executable} -c '
import sys, numpy as np, json
x = np.load(sys.argv[1]); eps = float(sys.argv[2])
d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
p = int(np.count_nonzero(np.triu(d2 <= eps * eps, k=1)))
print(json.dumps({{"pairs": p, "seconds": 0.05, "backend": "vulkan", "device": "Fake GPU", "batches": 1}}))' "$2" "$4"
fi
""")
    assert stats_for(1)  # the shape the real CLI prints (test_simjoin_runner_parses_stats)
    out = tmp_path / "out"
    rc = harness.main(["gpu", "--device", "0", "--simjoin-bin", str(binary), "--no-build", "--sizes", "300",
                       "--workloads", "uniform-2d,expo-16d", "--selectivities", "2,20", "--repeats", "2",
                       "--gds-join", str(fake_gds_source(tmp_path)), "--gds-define", "STAMP=1",
                       "--out", str(out), "--data-dir", str(tmp_path / "data")])  # fmt: skip
    assert rc == 0
    result = json.loads((out / "gpu-fake-gpu.json").read_text())
    for w in result["workloads"]:
        for p in w["points"]:
            gds, ours = p["systems"]["gds-join"], p["systems"]["simjoin-gpu"]
            assert gds["status"] == "ok", gds["message"]
            assert gds["pairs"] == ours["pairs"] > 0 and gds["agrees"]
            assert gds["median"] == pytest.approx(0.0125 + 0.125) and gds["reported_median"] == 0.125
            assert gds["speedup_end_to_end"] == pytest.approx(gds["median"] / ours["median"])
    builds = sorted(p.name for p in (tmp_path / "data" / "gds-build").iterdir())
    assert builds == ["gds-join-d16-double-sm90-STAMP1", "gds-join-d2-double-sm90-STAMP1"]
    params = (tmp_path / "data" / "gds-build" / builds[0] / "params.h").read_text()
    assert "#define GPUNUMDIM 16" in params and "#define NUMINDEXEDDIM 6" in params and "#define STAMP 1" in params
    md = (out / "gpu-fake-gpu.md").read_text()
    assert "GDS-Join (CUDA)" in md and "faster end to end" in md and "as it reports itself 0.125" in md
