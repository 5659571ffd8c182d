"""A pool for the expensive testers: tester calls on worker threads or worker processes.

The expensive testers (smCE's null simulation, LDTC's linear program) are numerical code whose
heavy parts run in numpy and HiGHS.  Which pool uses the two cores better was measured with
``scripts/bench_tester_pool.py`` (see the README, "Evaluation scheduling"): the choice is the
``evaluation.pool`` setting, ``process`` by default.

Process pool and data
---------------------
Nothing crosses the process boundary as a pickle of data the agent did not create: a job is a
JSON document (:func:`encode_data`: the grid, reservoir arrays and level-set statistics as
:func:`calmon.jsonio.pack_array` bytes) and a worker answers with the result's JSON
(:meth:`TestResult.to_dict`).  The executor itself still moves these ``str`` payloads through
its own queue, which is plain strings.  Workers start with ``spawn`` (no fork of a threaded
process) and ignore SIGINT/SIGTERM: shutdown is the agent's business, which stops submitting
and lets the jobs in flight finish (:meth:`TesterPool.close`), so a tester in flight never makes
the exit status non-zero.

Examples
--------
>>> import numpy as np
>>> from calmon.stats.data import CalibrationData
>>> d = CalibrationData(n=3, z=np.array([0.2, 0.5, 0.9]), y=np.array([0.0, 1.0, 1.0]), raw_is_complete=True)
>>> back = decode_data(encode_data(d))
>>> back.n, back.z.tolist(), back.raw_is_complete
(3, [0.2, 0.5, 0.9], True)
>>> pool = TesterPool("inline")
>>> res = pool.submit("smce", d, alpha=0.05, mc=19, seed=0, params={}).result()
>>> res.doc["decision"] in ("calibrated", "miscalibrated", "insufficient data"), pool.close()
(True, None)
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Mapping
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from calmon.jsonio import clean, pack_array, unpack_array
from calmon.stats.data import CalibrationData
from calmon.stats.grid import ScoreGrid
from calmon.stats.levelset import LevelSetStats
from calmon.testers import BUILTIN, TestResult, run_tester

log = logging.getLogger("calmon.agent")

__all__ = ["POOL_KINDS", "JobResult", "TesterPool", "decode_data", "encode_data", "run_job"]

#: Niceness added to worker processes (lower CPU priority than the agent's ingestion).
WORKER_NICE = 10
#: ``inline``: in the calling thread (tests); ``thread``/``process``: two workers by default.
POOL_KINDS = ("inline", "thread", "process")


def encode_data(d: CalibrationData) -> str:
    """``d`` as a JSON document (arrays packed, no pickle)."""
    arrays = {k: None if getattr(d, k) is None else pack_array(getattr(d, k), "<f8") for k in ("z", "y", "probs")}
    labels = None if d.labels is None else pack_array(d.labels, "<i8")
    return json.dumps({"n": int(d.n), "raw_is_complete": bool(d.raw_is_complete), **arrays, "labels": labels,
                       "grid": None if d.grid is None else d.grid.to_dict(),
                       "levelset": None if d.levelset is None else d.levelset.to_dict()})


def decode_data(text: str) -> CalibrationData:
    """Inverse of :func:`encode_data` (``ValueError`` on a malformed document)."""
    doc = json.loads(text)

    def arr(key: str, dtype: str) -> np.ndarray | None:
        return None if doc.get(key) is None else unpack_array(doc[key], dtype, tuple(doc[key]["shape"]))

    return CalibrationData(
        n=int(doc["n"]), z=arr("z", "<f8"), y=arr("y", "<f8"), probs=arr("probs", "<f8"), labels=arr("labels", "<i8"),
        grid=None if doc.get("grid") is None else ScoreGrid.from_dict(doc["grid"]),
        levelset=None if doc.get("levelset") is None else LevelSetStats.from_dict(doc["levelset"]),
        raw_is_complete=bool(doc["raw_is_complete"]))


class JobResult(NamedTuple):
    """A tester's result document and the seconds its call took (in the worker)."""

    doc: dict[str, Any]
    seconds: float


def _run(name: str, data: CalibrationData, alpha: float, mc: int, seed: int, params: Mapping[str, Any]
         ) -> JobResult:
    t0 = time.perf_counter()
    try:
        result = run_tester(name, data, alpha=alpha, mc=mc, seed=seed, **params)
    except Exception as exc:  # noqa: BLE001 - a tester is numerical code on live data; one failure must not stop the round
        log.warning("tester %s failed: %s", name, exc)
        result = TestResult.failed(name, exc)
    return JobResult(clean(result.to_dict()), time.perf_counter() - t0)


def run_job(job: str) -> str:
    """Worker entry point: a JSON job in, the result's JSON out (never raises for a tester's failure)."""
    doc = json.loads(job)
    data = decode_data(doc["data"])
    res = _run(doc["name"], data, doc["alpha"], doc["mc"], doc["seed"], doc["params"])
    return json.dumps({"result": res.doc, "seconds": res.seconds})


def _worker_init() -> None:
    # The parent decides when to stop; a Ctrl-C or SIGTERM sent to the process group must not
    # kill a worker mid-job (the parent would see a BrokenProcessPool and log a traceback).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Testers are background work: on two cores, ingestion (the parent) must not wait behind them.
    os.nice(WORKER_NICE)


class TesterPool:
    """Runs tester jobs and returns futures of :class:`JobResult` (``TestResult.to_dict()`` and seconds).

    Parameters
    ----------
    kind
        One of :data:`POOL_KINDS`.
    workers
        Worker threads or processes (``thread``/``process``).
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, kind: str = "process", workers: int = 2) -> None:
        if kind not in POOL_KINDS:
            raise ValueError(f"pool kind must be one of {POOL_KINDS}, got {kind!r}")
        self.kind = kind
        self.workers = 1 if kind == "inline" else max(1, int(workers))
        self._executor: Executor | None = None
        #: Plugin testers registered in this process only (a spawned worker does not know them) run here.
        self._threads: Executor | None = None
        if kind == "thread":
            self._executor = self._threads = ThreadPoolExecutor(self.workers, thread_name_prefix="calmon-tester")
        elif kind == "process":
            self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_worker_init)
            self._threads = ThreadPoolExecutor(1, thread_name_prefix="calmon-tester")

    def submit(self, name: str, data: CalibrationData, *, alpha: float, mc: int, seed: int,
               params: Mapping[str, Any]) -> Future[JobResult]:
        """Start one tester call; the future's result is the result document."""
        if self._executor is None:
            fut: Future[JobResult] = Future()
            fut.set_result(_run(name, data, alpha, mc, seed, params))
            return fut
        if self._threads is not None and (self.kind == "thread" or name not in BUILTIN):
            return self._threads.submit(_run, name, data, alpha, mc, seed, dict(params))
        job = json.dumps({"name": name, "alpha": alpha, "mc": mc, "seed": seed, "params": clean(dict(params)),
                          "data": encode_data(data)})
        out: Future[JobResult] = Future()
        inner = self._executor.submit(run_job, job)
        inner.add_done_callback(lambda f: _chain(f, out, name))
        return out

    def close(self, wait: bool = True) -> None:
        """Start no new job; with ``wait``, return once the jobs in flight have finished."""
        for ex in {id(e): e for e in (self._executor, self._threads) if e is not None}.values():
            ex.shutdown(wait=wait, cancel_futures=True)
        self._executor = self._threads = None


def _chain(inner: Future[str], out: Future[JobResult], name: str) -> None:
    if inner.cancelled():
        out.cancel()
        return
    exc = inner.exception()
    if exc is None:
        doc = json.loads(inner.result())
        out.set_result(JobResult(doc["result"], float(doc["seconds"])))
    else:  # a worker died (killed, out of memory): the window gets an error result, retried later
        out.set_result(JobResult(clean(TestResult.failed(name, exc).to_dict()), 0.0))
