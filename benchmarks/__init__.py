"""Benchmarks and statistical studies of calmon, run on demand from a checkout; never part of the wheel.

Each module is run as ``python -m benchmarks.NAME [options]`` from the repository root (``--help`` lists the
options); it measures the ``calmon`` and ``connectors`` that Python imports there, and has a ``main(argv)`` returning
the exit status.  A benchmark that compares this tree with another one (``--baseline DIR``, a directory holding
another version's packages, e.g. ``git archive REV calmon connectors | tar -x -C DIR``) runs each tree in a child
process whose ``PYTHONPATH`` starts with that tree (:mod:`benchmarks._child`); nothing edits ``sys.path``.
``tests/test_benchmarks_smoke.py`` runs every module at a tiny size.

Benchmarks (speed, memory): ``bench_agent``, ``bench_models`` (M models, issue #15), ``bench_ingest``,
``bench_decode``, ``bench_decoders``, ``bench_fold``, ``bench_join``, ``bench_snapshot``, ``bench_checkpoint``,
``bench_revisions`` (against a git revision), ``bench_files``, ``bench_kafka``, ``bench_parquet``, ``bench_cluster``,
``bench_metrics``, ``bench_tester_pool``, ``bench_window_base``, ``bench_estimates``, ``bench_verdict``,
``bench_tcal``, ``bench_tcal_kernel``, ``bench_tcal_screen``, ``bench_smooth``, ``bench_lp``, ``bench_emitter``,
``bench_nulls`` (CPU per window of each default tester, issue #35.2);
``docs_performance`` rewrites the table of ``docs/performance.md`` from a few of them;
``compare_agent_state`` checks that two trees build the same state and dead letters.

Statistical studies (level, power, coverage, paper re-runs): ``tcal_level``, ``tcal_power``, ``tcal_screen_power``,
``tcal_multiclass_level``, ``smce_level``, ``smooth_table1``, ``ldtc_level``, ``twosample_level``,
``scoredrift_level``, ``verdict_coverage``, ``estimate_eval``, ``changepoint_eval``, ``lp_groundtruth``,
``angular_section7``, ``recal_tcal_tables``.
"""
