"""A pool for the expensive testers: tester calls on worker threads or worker processes.

The expensive testers (smCE's null simulation, LDTC's linear program) are numerical code whose
heavy parts run in numpy and HiGHS.  Which pool uses the two cores better was measured with
``benchmarks/bench_tester_pool.py`` (see docs/performance.md, "Evaluation scheduling"): the choice is the
``evaluation.pool`` setting, ``process`` by default.

Process pool and data
---------------------
Nothing crosses the process boundary as a pickle of data the agent did not create: a job is a
JSON document (:func:`encode_data`: the grid, reservoir arrays and level-set statistics as
:func:`calmon.formats.jsonio.pack_array` bytes) and a worker answers with the result's JSON
(:meth:`TestResult.to_dict`).  The executor itself still moves these ``str`` payloads through
its own queue, which is plain strings.  Workers start with ``spawn`` (no fork of a threaded
process) and ignore SIGINT/SIGTERM: shutdown is the agent's business.  On a stop it abandons the
calls in flight (:meth:`TesterPool.close` with ``abandon``: the workers are killed, the calls'
futures are cancelled and nothing is recorded for them; the next run recomputes them, as it
recomputes every result), because one simulation may take minutes and a supervisor's grace period
is seconds (``docs/deploy.md``).  A tester in flight never makes the exit status non-zero.

Workers die with the agent however it dies, SIGKILL included (a worker blocked on the job queue
would otherwise wait forever, re-parented to init): on Linux the kernel signals them when the
agent goes (``prctl(PR_SET_PDEATHSIG)``), and everywhere a watchdog thread exits the worker once
its parent process is no longer the agent.  Their standard streams are ``/dev/null``: a supervisor
reading the agent's stdout and stderr sees them close when the agent dies, not when the last
worker does.  A worker prints nothing: its results, failures included, go back to the agent,
which logs a tester's failure.

Priorities
----------
An executor's queue is first in, first out.  A round waits for its T-Cal simulations (every window
gets T-Cal every round) but not for the scheduled testers, whose calls take up to a second each and
may still be queued from the previous round.  So jobs wait in the pool's own queue, most urgent
first (:data:`URGENT` before :data:`BACKGROUND`, then in order of submission), and the executor is
given at most two jobs per worker at a time (:data:`READY`): a simulation waits at most for the calls
already running and one more per worker.  (One job per worker left the workers idle while the parent,
busy with the round, passed each result on: 15 % slower on 711 T-Cal simulations.)

Identical calls
---------------
A built-in tester's result is a function of its job alone (tester, ``alpha``, ``mc``, seed, parameters and the
data: the generator is seeded by ``evaluation.seed``), so a job identical byte for byte to one already
submitted is not run again: it gets that call's result (its future, if still running), with 0 seconds of
cost.  Windows often hold the same statistics: every window of a model younger than its shortest window
(``24h``, ``7d`` and ``all`` are one sum for the first day), a model whose traffic stopped, segments equal to
the whole.  The last :data:`MEMO_JOBS` jobs are remembered by a 128-bit BLAKE2b digest of their JSON (for smCE
and LDTC on a window whose raw sample is incomplete, of the grid they read: :data:`GRID_ONLY`); a
cancelled or failed call is forgotten (the next identical job runs).  Plugin testers always run.

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
(True, 0)
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import (
    BrokenExecutor,
    Executor,
    Future,
    InvalidStateError,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
)
from typing import Any, NamedTuple

import numpy as np
from threadpoolctl import threadpool_limits

from calmon.formats.jsonio import clean, pack_array, unpack_array
from calmon.stats.data import CalibrationData
from calmon.stats.grid import ScoreGrid
from calmon.stats.levelset import LevelSetStats
from calmon.testers import BUILTIN, TESTERS, TestResult, run_tester

log = logging.getLogger("calmon.agent")

__all__ = ["BACKGROUND", "MEMO_JOBS", "POOL_KINDS", "URGENT", "JobResult", "TesterPool", "decode_data", "encode_data",
           "run_job"]

#: Niceness added to worker processes (lower CPU priority than the agent's ingestion).
WORKER_NICE = 10
#: BLAS threads in a worker process.
BLAS_THREADS = 1
#: Jobs handed to the executor per worker: one running, one ready to start.
READY = 2
#: ``inline``: in the calling thread (tests); ``thread``/``process``: two workers by default.
POOL_KINDS = ("inline", "thread", "process")
#: Job priorities: what the running round waits for, and the rest (smaller runs first).
URGENT, BACKGROUND = 0, 1
#: Jobs whose results are remembered for identical jobs (module docstring; a result document is ~1 kB).
MEMO_JOBS = 8192
#: Seconds to wait for a killed worker process to be reaped at shutdown.
REAP_SECONDS = 2.0
#: Seconds between two looks of a worker's watchdog at its parent.
WATCH_EVERY = 0.5
#: Signal the kernel sends a worker when the thread that started it ends (Linux); the worker then checks
#: whether its parent *process* is gone (a thread of the agent ending is not the agent ending).
PARENT_DEATH_SIGNAL = signal.SIGHUP
_PR_SET_PDEATHSIG = 1


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


def _detach_streams() -> None:
    """Point file descriptors 0, 1 and 2 at ``/dev/null`` (a spawned worker inherits the agent's)."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)


def _die_with(parent: int) -> None:
    """End this worker when process ``parent`` ends (see the module docstring)."""
    def orphaned() -> bool:
        return os.getppid() != parent

    def on_signal(signum: int, frame: Any) -> None:
        if orphaned():
            os._exit(1)

    signal.signal(PARENT_DEATH_SIGNAL, on_signal)
    try:  # Linux: the kernel signals at once, even while the main thread waits for a job
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the watchdog alone
        pass
    if orphaned():  # the parent died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while not orphaned():
            time.sleep(WATCH_EVERY)
        os._exit(1)

    threading.Thread(target=watch, name="calmon-parent-watch", daemon=True).start()


def _worker_init(parent: int | None = None) -> None:
    """Initializer of a worker process started by process ``parent`` (the agent)."""
    _detach_streams()
    if parent is not None:
        _die_with(parent)
    # The parent decides when to stop; a Ctrl-C or SIGTERM sent to the process group must not
    # kill a worker mid-job (the parent would see a BrokenProcessPool and log a traceback).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Testers are background work: on two cores, ingestion (the parent) must not wait behind them.
    os.nice(WORKER_NICE)
    # The workers are the pool's parallelism: a BLAS thread pool in each (OpenBLAS starts one per core)
    # oversubscribes the cores -- two workers simulating T-Cal took 2.3x longer than with one thread each.
    threadpool_limits(BLAS_THREADS)


class _Queue:
    """Jobs waiting for a worker, most urgent first; the executor holds at most ``limit`` at a time.

    A job is a function starting it on the executor (returning the executor's future) and the
    future handed to the caller, which is cancelled if the job never started.  An executor that
    broke (a worker process was killed: every later submission would fail) is replaced by a new one
    from ``make``; the jobs it held get error results, and the scheduler retries them in later rounds.
    """

    def __init__(self, make: Callable[[], Executor], limit: int) -> None:
        self._make = make
        self.executor = make()
        self._limit = limit
        self._lock = threading.Lock()
        self._heap: list[tuple[int, int, str, Callable[[Executor], Future[Any]], Future[JobResult]]] = []
        self._seq = itertools.count()
        self._running = 0
        self._closed = False
        self._worked = False  # a job finished on the current executor
        self._started: set[Future[JobResult]] = set()  # the callers' futures of the jobs handed to the executor

    def put(self, priority: int, name: str, start: Callable[[Executor], Future[Any]], out: Future[JobResult]) -> None:
        with self._lock:
            heapq.heappush(self._heap, (priority, next(self._seq), name, start, out))
        self._pump()

    def _pump(self) -> None:
        while True:
            with self._lock:
                if self._closed or self._running >= self._limit or not self._heap:
                    return
                _, _, name, start, out = heapq.heappop(self._heap)
                self._running += 1
            if out.cancelled():  # given up on while it waited
                self._finished(None, pump=False)
                continue
            try:
                inner = self._start(start)
            except Exception as exc:  # noqa: BLE001 - a shut-down executor, or a new one that broke at once
                self._finished(None, pump=False)
                _settle(out, JobResult(clean(TestResult.failed(name, exc).to_dict()), 0.0))
                continue
            with self._lock:
                self._started.add(out)
            out.add_done_callback(self._forget)
            inner.add_done_callback(self._finished)

    def _start(self, start: Callable[[Executor], Future[Any]]) -> Future[Any]:
        ex = self.executor
        try:
            return start(ex)
        except BrokenExecutor:
            with self._lock:
                # new workers only for workers that had worked: ones that cannot start (a broken installation)
                # would be replaced on every job
                if self._closed or not self._worked:
                    raise
                if self.executor is ex:
                    log.warning("tester pool broken (a worker died): starting new workers")
                    self.executor = self._make()
                    self._worked = False
                    ex.shutdown(wait=False, cancel_futures=True)
            return start(self.executor)

    def _forget(self, out: Future[JobResult]) -> None:
        with self._lock:
            self._started.discard(out)

    def _finished(self, inner: Future[Any] | None, *, pump: bool = True) -> None:
        with self._lock:
            self._running -= 1
            if inner is not None and not inner.cancelled() and inner.exception() is None:
                self._worked = True
        if pump:
            self._pump()  # runs in the executor's callback thread: starting a job there is what it is for

    def close(self, wait: bool, abandon: bool = False) -> int:
        """Start nothing more: jobs still waiting are cancelled; with ``wait``, return once the running
        ones have finished; with ``abandon``, kill the worker processes first (their calls are lost).

        Returns the jobs that were running (abandoned with ``abandon``) plus those still waiting.
        """
        with self._lock:
            self._closed = True
            waiting, self._heap = self._heap, []
            running = self._running
            started = list(self._started) if abandon else []
        for *_, out in waiting:
            out.cancel()
        for out in started:  # cancelled, not failed: a killed call is no tester error, nothing is recorded
            out.cancel()
        workers = _kill_workers(self.executor) if abandon else []
        self.executor.shutdown(wait=wait and not abandon, cancel_futures=True)
        for proc in workers:  # reap them (killed: at once), so none is left a zombie or an orphan
            proc.join(REAP_SECONDS)
        return running + len(waiting)


def _kill_workers(ex: Executor) -> list[Any]:
    """SIGKILL the worker processes of a process pool (they ignore SIGTERM); returns them.

    ``ProcessPoolExecutor`` has no public way to stop a running call before Python 3.14
    (``kill_workers``); its ``_processes`` map (pid -> ``Process``) is the same one that method uses."""
    procs = list((getattr(ex, "_processes", None) or {}).values())
    for proc in procs:
        try:
            proc.kill()
        except (OSError, ValueError, AttributeError):  # already gone, or closed
            pass
    return procs


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
        self._queue: _Queue | None = None
        #: digest of a job -> the future of its first call (module docstring, "Identical calls")
        self._memo: OrderedDict[bytes, Future[JobResult]] = OrderedDict()
        self._memo_lock = threading.Lock()
        #: Jobs answered by an identical earlier job.
        self.shared = 0
        #: Plugin testers registered in this process only (a spawned worker does not know them) run here.
        self._threads: Executor | None = None
        n = self.workers
        if kind == "thread":
            self._queue = _Queue(lambda: ThreadPoolExecutor(n, thread_name_prefix="calmon-tester"), READY * n)
        elif kind == "process":
            spawn = multiprocessing.get_context("spawn")
            self._queue = _Queue(lambda: ProcessPoolExecutor(n, mp_context=spawn, initializer=_worker_init,
                                                             initargs=(os.getpid(),)), READY * n)
            self._threads = ThreadPoolExecutor(1, thread_name_prefix="calmon-tester")

    def submit(self, name: str, data: CalibrationData, *, alpha: float, mc: int, seed: int,
               params: Mapping[str, Any], priority: int = BACKGROUND) -> Future[JobResult]:
        """Start one tester call (after every waiting job of a smaller ``priority``); the future's result is
        the result document."""
        if self._queue is None:
            fut: Future[JobResult] = Future()
            fut.set_result(_run(name, data, alpha, mc, seed, params))
            return fut
        if self._threads is not None and name not in BUILTIN:
            return self._threads.submit(_run, name, data, alpha, mc, seed, dict(params))
        job = json.dumps({"name": name, "alpha": alpha, "mc": mc, "seed": seed, "params": clean(dict(params)),
                          "data": encode_data(data)})
        key = _memo_key(name, job, data, alpha, mc, seed, params) if _pure(name) else None
        if key is not None and (first := self._recall(key)) is not None:
            return _follow(first)
        out: Future[JobResult] = Future()
        if self.kind == "thread":
            args = (name, data, alpha, mc, seed, dict(params))
            self._queue.put(priority, name, lambda ex: _chained(ex.submit(_run, *args), out, name), out)
        else:
            self._queue.put(priority, name, lambda ex: _chained(ex.submit(run_job, job), out, name), out)
        if key is not None:
            with self._memo_lock:
                self._memo[key] = out
                while len(self._memo) > MEMO_JOBS:
                    self._memo.popitem(last=False)
        return out

    def _recall(self, key: bytes) -> Future[JobResult] | None:
        """The call of an identical earlier job, unless it was cancelled or failed (then forgotten)."""
        with self._memo_lock:
            first = self._memo.get(key)
            if first is None:
                return None
            if first.cancelled() or (first.done() and first.result().doc.get("decision") == "error"):
                del self._memo[key]
                return None
            self._memo.move_to_end(key)
            self.shared += 1
            return first

    def close(self, wait: bool = True, *, abandon: bool = False) -> int:
        """Start no new job; with ``wait``, return once the jobs in flight have finished; with ``abandon``
        (shutdown), kill the worker processes instead of waiting for their calls.

        Returns how many tester calls were in flight or waiting (with ``abandon``: abandoned).  Calls on
        threads (``thread`` pools, plugin testers) cannot be killed: they are abandoned, not waited for, but
        the interpreter's exit still waits for the one running (``docs/agent.md``, "Stopping").
        """
        n = 0
        if self._queue is not None:
            n += self._queue.close(wait and not abandon, abandon and self.kind == "process")
        if self._threads is not None:
            self._threads.shutdown(wait=wait and not abandon, cancel_futures=True)
        self._queue = self._threads = None
        return n


def _pure(name: str) -> bool:
    """Tester ``name`` is a built-in one (its result is a function of its job); a plugin may not be."""
    fn = BUILTIN.get(name)
    return fn is not None and name in TESTERS and TESTERS.get(name) is fn


#: Built-in testers that read a window's grid only, unless its raw sample is complete (or it has no grid):
#: ``smce._estimate``/``ldtc._binned``.  Their identical jobs are recognised by the grid alone -- the windows of
#: one ring hold one grid but reservoir samples drawn apart.
GRID_ONLY = frozenset({"smce", "ldtc"})


def _memo_key(name: str, job: str, data: CalibrationData, alpha: float, mc: int, seed: int,
              params: Mapping[str, Any]) -> bytes:
    """Digest of what the call's result depends on (module docstring, "Identical calls")."""
    text = job
    if name in GRID_ONLY and data.grid is not None and not data.raw_is_complete:
        text = json.dumps({"name": name, "alpha": alpha, "mc": mc, "seed": seed, "params": clean(dict(params)),
                           "n": int(data.n), "grid": data.grid.to_dict()})
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _follow(first: Future[JobResult]) -> Future[JobResult]:
    """A new future with ``first``'s result (0 seconds: nothing more ran), cancelled if ``first`` is."""
    out: Future[JobResult] = Future()

    def done(f: Future[JobResult]) -> None:
        if f.cancelled():
            out.cancel()
        else:
            _settle(out, JobResult(dict(f.result().doc), 0.0))
    first.add_done_callback(done)
    return out


def _chained(inner: Future[Any], out: Future[JobResult], name: str) -> Future[Any]:
    inner.add_done_callback(lambda f: _chain(f, out, name))
    return inner


def _chain(inner: Future[Any], out: Future[JobResult], name: str) -> None:
    """``out`` gets the job's result: a :class:`JobResult`, or a worker's JSON answer decoded."""
    if out.done():  # cancelled by the caller
        return
    if inner.cancelled():  # at shutdown
        out.cancel()
        return
    exc = inner.exception()
    if exc is not None:  # a worker died (killed, out of memory): the window gets an error result, retried later
        res = JobResult(clean(TestResult.failed(name, exc).to_dict()), 0.0)
    elif isinstance(got := inner.result(), JobResult):
        res = got
    else:
        doc = json.loads(got)
        res = JobResult(doc["result"], float(doc["seconds"]))
        if res.doc.get("decision") == "error":  # the worker's own log goes nowhere (its stderr is /dev/null)
            log.warning("tester %s failed: %s", name, res.doc.get("error"))
    _settle(out, res)


def _settle(out: Future[JobResult], res: JobResult) -> None:
    try:
        out.set_result(res)
    except InvalidStateError:  # cancelled by the caller meanwhile
        pass
