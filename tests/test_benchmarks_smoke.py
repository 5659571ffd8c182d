"""Every module of ``benchmarks/`` at a tiny size: it runs and prints its table (no timing assertions).

Each case calls the module's ``main(argv)`` in this process, as ``python -m benchmarks.NAME argv`` would; the
benchmarks that measure in child processes (``--baseline``, peak RSS) start them as they always do, and a case
with ``--baseline`` passes this tree as the baseline, so the child-process path runs too.  ``bench_models`` has
its own reduced run in ``tests/test_bench_models.py``.  The cases whose children start a whole agent (or several
interpreters) are marked ``slow``: ``-m "not slow"`` keeps the rest, about a minute of CPU.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks
from benchmarks._child import ROOT, current
from tests.conftest import TCAL_DATA, require

#: This tree, as a --baseline DIR (the child-process path, compared with itself).
TREE = str(current())


def _run(capfd: pytest.CaptureFixture[str], module: str, *argv: str) -> str:
    """``benchmarks.<module>.main(argv)``: exit status 0; the output of the process and of its children."""
    mod = importlib.import_module(f"benchmarks.{module}")
    assert mod.main(list(argv)) == 0
    out, _ = capfd.readouterr()
    return str(out)


def _has(out: str, *parts: str) -> None:
    missing = [p for p in parts if p not in out]
    assert not missing, f"missing {missing} in:\n{out[-3000:]}"


#: (module, argv, what the output must contain) -- pure computations, one process.
CASES: list[tuple[str, list[str], list[str]]] = [
    ("angular_section7", ["--seeds", "1", "--n", "60", "--d", "40", "--test", "500", "--sign-trials", "50"],
     ["| seed | inner_true | inner_hat | ece_uncal |", "ece_platt_100", "| mean |"]),
    ("bench_checkpoint", ["--models", "2", "--events", "2000", "--pending", "500", "--rounds", "1"],
     ["| models | buckets | phase | longest lock hold s |", "| restore |", "join buffers: 500 pending",
      "peak_rss_mb"]),
    ("bench_decoders", ["--events", "3000", "--repeat", "1", "--no-memory"],
     ["events/s best", "calmon (msgspec + validation)", "calmon mapped, nested+ms+labels"]),
    ("bench_emitter", ["--events", "200", "--rounds", "1"],
     ["min us", "json.dumps (baseline)", "Emitter.to_file", "Emitter.to_kafka (queue)"]),
    ("bench_files", ["--lines", "500", "--repeat", "1"],
     ["lines/s", "jsonl (no origins)", "csv p0..p9,label", "dead-letter sink"]),
    ("bench_join", ["--pending", "2000", "--batch", "500", "--rounds", "2"],
     ["| joiner | records/s (best) | records/s (median) |", "ratio pending / empty"]),
    ("bench_lp", ["--n", "3000", "--classes", "3"], ["statistics", "fit", "Theorem 7 budget"]),
    ("bench_metrics", ["--models", "1", "2", "--rounds", "1"],
     ["reliability none", "prepare min/med s", "core + tests only"]),
    ("bench_smooth", ["--sizes", "300", "--large", "3000", "--repeat", "1"],
     ["case", "HiGHS chain LP", "smCE 4096-cell stats", "LDTC 256 bins", "CPU-time speed-up DP vs HiGHS"]),
    ("bench_snapshot", ["--models", "2", "--events", "3000", "--rounds", "1", "--first", "1", "--compare"],
     ["first snapshot after the ingest", "reference windows differing: 0", "later new: wall", "ratio reference/new"]),
    ("bench_tcal", ["--skip-nine", "--authors-seconds", "60", "--ref-draws", "0", "--scaling", "3000", "--repeat", "1"],
     ["calibrated sample", "ours (default  )", "cost from binned statistics"]),
    ("bench_tcal", ["--agreement", "1"], ["screened vs pure Monte Carlo", "same decision: "]),
    ("bench_tester_pool", ["--windows", "1", "--events", "300", "--rounds", "1", "--mc", "19", "--testers", "smce"],
     ["sequential:", "thread:", "process:"]),
    ("bench_verdict", ["--rounds", "1", "--calls", "2"], ["summarize", "baseline l2_ece_squared", "ratio (median)"]),
    ("changepoint_eval", ["--events", "2000", "--trials", "1", "--rate", "0.2", "--every", "1200", "--cost-events",
                          "2000"], ["# false alarms", "# median detection delay", "# cost per event",
                                    "detector_ns_per_event_min"]),
    ("estimate_eval", ["--windows", "5", "--n", "200", "--rate", "0.05", "--delay", "5"],
     ["# coverage of 95 % intervals", "covariate shift", "calibration drift"]),
    ("ldtc_level", ["--ns", "200", "--reps", "2", "--mc", "9", "--every", "2"], ["rejection rate of the LDTC"]),
    ("lp_tester_rates", ["--reps", "2", "--ns", "1000", "--eval-n", "20000"],
     ["| model | p | true Err_p | eps | n | miscalibrated |", "| calibrated K=3 | inf | 0.0000 | 0.0500 | 1000 |",
      "| distorted K=10 | inf |"]),
    ("ldtc_level", ["--ns", "200", "--reps", "2", "--mc", "9", "--tester"], ["CPU s per test"]),
    ("bench_nulls", ["--sizes", "300", "--windows", "1", "--mc", "19"], ["smce s", "12,000 windows"]),
    ("lp_groundtruth", ["--settings", "2,3", "--sizes", "2e3", "--eval-n", "4e3"],
     ["Einf f", "dSq", "concentrated   3    2", "concentrated  10  inf"]),
    ("scoredrift_level", ["--reps", "2"], ["rejection rate"]),
    ("smce_level", ["--reps", "2", "--n", "100", "--mc", "19"], ["alpha", "rate"]),
    ("smce_level", ["--reps", "2", "--n", "300", "--mc", "19", "--mode", "tester", "--param", "null_bins=64"],
     ["mode=tester", "mean draws"]),
    ("smooth_table1", ["--runs", "1", "--dce-max-n", "65", "--u-points", "11"], ["smCE", "dCE"]),
    ("tcal_level", ["--reps", "2", "--n", "300", "--dists", "uniform", "--mc", "19"], ["uniform", "mc-grid"]),
    ("tcal_multiclass_level", ["--ks", "3", "--ns", "300", "--reps", "2", "--mc", "99", "--every", "2"],
     ["canonical", "top_label", "classwise"]),
    ("tcal_power", ["--reps", "2", "--n", "500", "--mc", "99"], ["typeII", "tcal-bonf", "plugin15-l1"]),
    ("tcal_screen_power", ["--reps", "2", "--n", "200", "--temps", "1.0", "--mc", "99"], ["in band", "lost"]),
    ("twosample_level", ["--reps", "2", "--n", "200", "--permutations", "19"], ["level", "power"]),
    ("verdict_coverage", ["--reps", "2", "--n", "200", "--kinds", "none", "temperature:0.7", "--truth-points", "20000"],
     ["true ECE", "coverage", "temperature:0.7"]),
]


def test_every_module_has_a_case() -> None:
    """A new benchmark gets a smoke case (or says where its reduced run lives)."""
    names = {m.name for m in pkgutil.iter_modules(benchmarks.__path__) if not m.name.startswith("_")}
    covered = {c[0] for c in CASES} | {"bench_agent", "bench_cluster", "bench_decode", "bench_estimates",
                                       "bench_fold", "bench_ingest", "bench_kafka", "bench_parquet",
                                       "bench_revisions", "bench_tcal_kernel", "bench_tcal_screen",
                                       "bench_scaleout",  # test_bench_scaleout_summary below
                                       "bench_window_base", "compare_agent_state", "recal_tcal_tables",
                                       "bench_models",  # bench_models: tests/test_bench_models.py
                                       "bench_platform",  # tests/test_bench_platform.py
                                       "docs_performance",  # tests/test_docs_performance.py
                                       "fuzz"}  # the fuzz suite itself runs in CI (tests/fuzz)
    assert names == covered, sorted(names ^ covered)


@pytest.mark.parametrize(("module", "argv", "expect"), CASES, ids=[f"{c[0]}:{' '.join(c[1][:2])}" for c in CASES])
def test_module_at_tiny_size(capfd: pytest.CaptureFixture[str], module: str, argv: list[str],
                             expect: list[str]) -> None:
    _has(_run(capfd, module, *argv), *expect)


def test_runs_as_a_module_from_the_checkout() -> None:
    """``python -m benchmarks.NAME`` from the repository root, with no ``sys.path`` edit anywhere."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_verdict", "--rounds", "1", "--calls", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ratio (median)" in out.stdout
    offenders = [p.name for p in sorted(Path(benchmarks.__file__).parent.glob("*.py"))
                 if "sys.path.insert" in p.read_text() or "sys.path.append" in p.read_text()]
    assert offenders == []


# -- child processes: this tree against itself as the baseline --------------------------------------------------
def test_bench_decode_against_a_baseline(capfd: pytest.CaptureFixture[str]) -> None:
    out = _run(capfd, "bench_decode", "--models", "1,2", "--events", "300", "--rounds", "1", "--baseline", TREE)
    _has(out, "| tree | models | decode s | over M = 1 (medians) |", "| current | 2 |", "| baseline | 2 |")


def test_bench_ingest_and_fold(capfd: pytest.CaptureFixture[str]) -> None:
    out = _run(capfd, "bench_ingest", "--models", "1", "--events", "500", "--rounds", "1")
    _has(out, "| tree | models | ev/s | live ratio (medians) | CPU ratio (medians) | wall s | CPU s | decode s |",
         "| current | 1 |")
    out = _run(capfd, "bench_fold", "--models", "2", "--events", "500", "--rounds", "1", "--repeat", "1")
    _has(out, "fold replay, M=2", "current   fold", "current   cpu", "current   state digests ['")


@pytest.mark.slow
def test_bench_agent(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = _run(capfd, "bench_agent", "--sizes", "2000", "--workdir", str(tmp_path))
    _has(out, "| events | ingest s | events/s | decoder alone events/s | state MB |", "| 2,000 |")


@pytest.mark.slow
def test_compare_agent_state(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from benchmarks.bench_agent import generate

    path = tmp_path / "events.jsonl"
    generate(path, 1000)
    with path.open("ab") as f:
        f.write(b"not json\n")  # one dead letter
    out = _run(capfd, "compare_agent_state", "--baseline", TREE, str(path))
    _has(out, f"{path}: same state", "dead letters 1 ")


@pytest.mark.slow
def test_bench_window_base(capfd: pytest.CaptureFixture[str]) -> None:
    out = _run(capfd, "bench_window_base", "--baseline", TREE, "--windows", "3", "--rounds", "1", "--reps", "1")
    _has(out, "documents identical: True", "window_base speed-up", "verdict speed-up")


def test_bench_tcal_screen_and_kernel(capfd: pytest.CaptureFixture[str]) -> None:
    out = _run(capfd, "bench_tcal_screen", "--rounds", "1", "--reps", "1", "--windows", "1")
    _has(out, "CPU ms per call", "current")
    out = _run(capfd, "bench_tcal_kernel", "--rounds", "1", "--reps", "1", "--windows", "grid:100")
    _has(out, "grid n=100")


@pytest.mark.slow
def test_bench_revisions_against_a_directory(capfd: pytest.CaptureFixture[str]) -> None:
    out = _run(capfd, "bench_revisions", TREE, "--events", "300", "--rounds", "1", "--kinds", "pairs")
    _has(out, "old events/s", "new events/s", "pairs ")


def test_bench_estimates_against_head(capfd: pytest.CaptureFixture[str]) -> None:
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout: bench_estimates reads its baseline with git show")
    out = _run(capfd, "bench_estimates", "--baseline", "HEAD", "--events", "100", "--rounds", "1", "--calls", "1")
    _has(out, "speed-up (median)", "identity", "linear")


@pytest.mark.slow
def test_bench_parquet(capfd: pytest.CaptureFixture[str]) -> None:
    out = _run(capfd, "bench_parquet", "--rows", "1000")
    _has(out, "peak RSS MiB", "baseline", "reader", "check")


@pytest.mark.slow
def test_bench_cluster_compute(capfd: pytest.CaptureFixture[str]) -> None:
    out = _run(capfd, "bench_cluster", "--events", "300", "--partitions", "2", "--range", "200", "--rounds", "1",
               "--workers", "1,2")
    _has(out, '"delta_bytes_per_record_v3"', '"together_v3_vs_single_best"', '"evaluate_v2_records_per_cpu_s_best"',
         '"delta_bytes_per_record_v4"', '"together_v4_vs_single_best"', "| together_v3 |", "| together_v4raw |",
         "| 2 |", '"workers_2_cpu_vs_one_best"')


@pytest.mark.slow
def test_studies_on_the_tcal_data(capfd: pytest.CaptureFixture[str]) -> None:
    require(len(sorted(TCAL_DATA.glob("*.npz"))) == 9, f"the nine T-Cal data files in {TCAL_DATA}")
    out = _run(capfd, "bench_tcal", "--tables", "--models", "cifar10_resnet50")
    _has(out, "Tables 1-3, row 'None'", "cifar10_resnet50")
    out = _run(capfd, "recal_tcal_tables", "--models", "cifar10_resnet50", "--mc", "99")
    _has(out, "| model |", "C10 ResNet-50")


@pytest.mark.integration
def test_bench_kafka(capfd: pytest.CaptureFixture[str]) -> None:
    from tests.kafka_broker import require_broker

    require_broker()
    out = _run(capfd, "bench_kafka", "--n", "300", "--partitions", "1", "--repeat", "1",
               "--runs", "raw,source,memory-agent,agent")
    _has(out, "median rec/s", "kafka-python raw", "kafka-python source", "rate ratio agent / memory-agent")


@pytest.mark.integration
def test_bench_cluster_broker_scaling(capfd: pytest.CaptureFixture[str]) -> None:
    from tests.kafka_broker import require_broker

    require_broker()
    out = _run(capfd, "bench_cluster", "--events", "600", "--partitions", "4", "--range", "200", "--rounds", "1",
               "--broker-workers", "1,2", "--only-broker")
    _has(out, "ingest workers on a real broker (Tansu)", '"broker_workers_2_cpu_vs_one_best"', "| 2 |")


@pytest.mark.slow
def test_bench_scaleout_summary(capfd: pytest.CaptureFixture[str]) -> None:
    out = _run(capfd, "bench_scaleout", "--no-kafka", "--events", "300", "--rounds", "1", "--workers", "1,2",
               "--broker-workers", "")
    _has(out, "issue #33 goals", "| two stages together / single process (records per CPU-s) | >= 0.6 |",
         "| 2 ingest processes, records per CPU-s per worker / one worker's | >= 0.8 |")
