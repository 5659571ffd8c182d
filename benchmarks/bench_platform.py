"""Issue #35's "Done when" at M models x 3 rings: the agent run as a user runs it, side by side with one model.

Each M runs in its own subprocess with the **default configuration** (``build_config`` of a minimal document, as
``calmon run``: default windows ``1h, 24h, 7d, all``, testers ``tcal, smce, ldtc``, ``evaluation.every`` 60 s,
budget 30 s, checkpoints, the exporter with its defaults) plus what a user with M models sets: the segments
``web, app`` allow-listed (rings ``all``, ``web``, ``app``) and ``limits.max_models``.  The exporter listens on
a free port and is scraped over HTTP, as Prometheus scrapes it.  ``Agent.run`` runs in the child's main thread
(ingestion), its scheduler and HTTP threads as in production.  The traffic (``benchmarks.bench_models.Traffic``,
live-like: predictions, each followed by its outcome after an exponential delay of mean 60 s) is:

* **backfill**: one hour of traffic up to the start (``--events`` predictions whatever M, as ``bench_models``:
  the rates compare the same work spread over M models), read as fast as the agent ingests it (the ingest rate
  is records over the seconds spent in the input's ``ingest``, the scheduler's first rounds running alongside);
* **live**: then ``--rate`` predictions a second (with their outcomes) at the pace of the wall clock, event times
  following it, for ``--seconds`` seconds.

An observer thread scrapes ``/metrics`` every ``--scrape`` seconds (once plain, once with ``Accept-Encoding:
gzip``: the bytes and seconds of a scrape) and reads ``/api/status``: the share of windows with data (``n`` > 0)
holding a result (a decision other than ``error``, with ``evaluated_at``) of **every** configured tester, at
``--within`` seconds after the backfill was ingested, with the CPU seconds the agent's process and its tester
workers got meanwhile (``cpu_within``, printed to stderr: on a shared machine, what coverage could be bought); and
the rounds that overran in the last minute of the run.
The table shows M = 1 and each M, measured in the same run, and which goal each M meets:

    nice -n 10 python -m benchmarks.bench_platform                  # M = 200 (about 9 minutes)
    python -m benchmarks.bench_platform --quick                     # a smoke run (seconds)

Only public entry points are used (``Agent(cfg, sources)``, ``run``, ``status``, ``sched_info``,
``state.nbytes``, the HTTP endpoint).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from benchmarks._child import last_json, run_module
from benchmarks.bench_models import SEGMENTS, Traffic

BEGIN, END = "<!-- BEGIN benchmarks.bench_platform -->", "<!-- END benchmarks.bench_platform -->"
#: Issue #35's goals: (what, limit, test of one M's row against the M = 1 row).
GOALS: tuple[tuple[str, str, Any], ...] = (
    ("ingest vs M = 1", ">= 0.50", lambda r, b: r["rate"] / b["rate"] >= 0.5),
    ("state per ring", "<= 250 kB", lambda r, b: r["state"] / r["rings"] <= 250e3),
    ("/metrics size", "<= 4 MB", lambda r, b: r["metrics_bytes"] <= 4e6),
    ("/metrics scrape", "<= 1 s", lambda r, b: r["scrape_s"] <= 1.0),
    ("windows with a result of every tester", ">= 90 %", lambda r, b: r["coverage"] >= 0.9),
    ("overruns in the last minute", "0", lambda r, b: r["overruns_last_min"] == 0),
)
COLUMNS = ("models", "rings", "ingest ev/s", "ratio", "state/ring", "/metrics MB (gzip)", "scrape s", "series",
           "windows with data", "every tester by {within}", "per tester", "rounds", "overruns last min")


# -- the child: one agent ---------------------------------------------------------------------------------------
class PacedSource:
    """A read-once source: the backfill's records at once, then live records as the wall clock reaches them.

    ``chunks`` yields (release time, records); a read returns what is due (positions are record counts).
    """

    def __init__(self, name: str, backfill: Iterator[bytes], chunks: Iterator[tuple[float, list[bytes]]]) -> None:
        self.name = name
        self._backfill: Iterator[bytes] | None = backfill
        self._chunks = chunks
        self._due: list[bytes] = []
        self._next: tuple[float, list[bytes]] | None = None
        self.records = 0
        self.backfilled = threading.Event()  # set once the backfill's last record was handed out
        self._done = False

    @property
    def exhausted(self) -> bool:
        return self._done

    def read(self, max_records: int = 65536, timeout: float = 0.5) -> Any:
        from connectors.base import Batch
        out: list[bytes] = []
        if self._backfill is not None:
            out = [r for _, r in zip(range(max_records), self._backfill)]
            if len(out) < max_records:
                self._backfill = None
        if not out:
            if self._backfill is None and not self.backfilled.is_set():
                self.backfilled.set()
            out = self._live(max_records, timeout)
        if not out:
            return None
        self.records += len(out)
        return Batch(out, self.position(), self.name)

    def _live(self, max_records: int, timeout: float) -> list[bytes]:
        deadline = time.time() + timeout
        while True:
            if self._next is None:
                self._next = next(self._chunks, None)
                if self._next is None:
                    self._done = not self._due
                    break
            at, recs = self._next
            if at > time.time():
                if self._due or time.time() >= deadline:
                    break
                time.sleep(min(0.05, max(0.0, at - time.time())))
                continue
            self._due.extend(recs)
            self._next = None
        out, self._due = self._due[:max_records], self._due[max_records:]
        return out

    def position(self) -> dict[str, Any]:
        return {"kind": "bench", "records": self.records}

    def seek(self, position: Mapping[str, Any]) -> None:
        self.records = int(position["records"])

    def close(self) -> None:
        self._chunks = iter(())


def traffic(models: int, events: int, rate: float, seconds: float, seed: int, now: float
            ) -> tuple[Iterator[bytes], Iterator[tuple[float, list[bytes]]]]:
    """The backfill (an hour of ``events`` predictions up to ``now``) and the live chunks (one a second)."""
    backfill = Traffic("live", models, events, seed, start=now - 3600.0, span=3600.0).records()

    def chunks() -> Iterator[tuple[float, list[bytes]]]:
        per = max(1, round(rate))
        for s in range(int(seconds)):
            t = now + s
            yield t, list(Traffic("live", models, per, seed + 1 + s, start=t, span=1.0).records())
    return backfill, chunks()


def config(state_dir: str, models: int, every: float | None) -> Any:
    """The default configuration with what a user of ``models`` models x 3 rings sets."""
    from calmon.config import build_config
    doc: dict[str, Any] = {"state_dir": state_dir, "sources": [{"path": "unused.jsonl"}],
                           "models": {"default": {"segments": list(SEGMENTS)}},
                           "limits": {"max_models": max(50, models)}, "exporter": {"port": 0}}
    if every is not None:  # the smoke run's short rounds
        doc["evaluation"] = {"every": every, "budget": every / 2}
    return build_config(doc, env={})


@dataclass
class Observer:
    """Scrapes ``/metrics`` and reads the status while the agent runs (a thread of the child)."""

    agent: Any
    source: PacedSource
    within: float
    scrape_every: float
    end: float
    out: dict[str, Any] = field(default_factory=dict)
    overruns: list[tuple[float, int]] = field(default_factory=list)
    scrapes: list[tuple[float, int, float, int]] = field(default_factory=list)

    def run(self) -> None:
        while not self.source.backfilled.wait(0.2):
            if time.time() > self.end:
                return
        t0 = time.time()
        self.out["backfill_end"] = t0
        cpu0 = cpu_seconds()
        coverage_done = False
        while time.time() < self.end - 0.5 and not self.agent.stopping:
            self.scrape()
            self.overruns.append((time.time(), int(self.agent.sched_info.get("overruns", 0))))
            if not coverage_done and time.time() - t0 >= self.within:
                self.out.update(coverage(self.agent))
                cpu = cpu_seconds()
                self.out["cpu_within"] = {k: round(cpu[k] - cpu0[k], 1) for k in cpu}
                coverage_done = True
            nxt = min(time.time() + self.scrape_every, t0 + self.within if not coverage_done else self.end)
            time.sleep(max(0.05, min(nxt, self.end - 0.5) - time.time()))
        if not coverage_done:
            self.out.update(coverage(self.agent))
        self.out["state"] = _state_bytes(self.agent)
        self.out["rounds"] = int(self.agent.sched_info.get("evaluations", 0))
        self.scrape()

    def scrape(self) -> None:
        url = self.agent.http.url + "/metrics"
        t = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as resp:
            body = resp.read()
        took = time.perf_counter() - t
        req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            zipped = resp.read()
            gz = len(zipped) if resp.headers.get("Content-Encoding") == "gzip" else len(gzip.compress(body))
        fams: dict[str, list[int]] = {}
        for line in body.split(b"\n"):
            if line and not line.startswith(b"#"):
                f = fams.setdefault(line.split(b"{", 1)[0].split(b" ", 1)[0].decode(), [0, 0])
                f[0] += 1
                f[1] += len(line) + 1
        self.scrapes.append((took, len(body), gz, sum(n for n, _ in fams.values())))
        self.out["families"] = dict(sorted(fams.items(), key=lambda kv: -kv[1][1])[:8])  # series, bytes


def cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of this process (the agent: ingestion, rounds, HTTP) and of its child processes that
    are still running (the tester workers), read from ``/proc`` (Linux; zeros elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    me, kids = 0.0, 0.0
    try:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            used = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            if int(entry) == os.getpid():
                me = used
            elif int(fields[1]) == os.getpid():  # ppid
                kids += used
    except OSError:
        pass
    return {"agent": me, "workers": kids}


def _state_bytes(agent: Any) -> int:
    nb = agent.state.nbytes()
    return int(sum(nb.values())) if isinstance(nb, Mapping) else int(nb)


def coverage(agent: Any) -> dict[str, Any]:
    """Windows with data, and how many hold a result of each tester and of every tester."""
    doc = agent.status()
    testers = list(doc["agent"]["tests"])
    evs = [e for e in doc["evaluations"] if e.get("window") != "stream" and (e.get("n") or 0) > 0]
    have = {t: sum(1 for e in evs if _result((e.get("tests") or {}).get(t))) for t in testers}
    every = sum(1 for e in evs if all(_result((e.get("tests") or {}).get(t)) for t in testers))
    return {"windows": len(evs), "every": every, "per_tester": have,
            "coverage": every / len(evs) if evs else 0.0}


def _result(r: Any) -> bool:
    return isinstance(r, Mapping) and r.get("evaluated_at") is not None and r.get("decision") not in (None, "error")


def child(models: int, events: int, rate: float, seconds: float, within: float, scrape_every: float,
          every: float | None, seed: int) -> dict[str, Any]:
    """Run the agent on ``models`` models for ``seconds`` after the backfill; every figure as a JSON-able dict."""
    from calmon.agent.runtime import Agent
    with tempfile.TemporaryDirectory(prefix="calmon-bench-platform-") as tmp:
        now = float(int(time.time()))
        backfill, chunks = traffic(models, events, rate * models, seconds + 5, seed, now)
        src = PacedSource("live", backfill, chunks)
        agent = Agent(config(f"{tmp}/state", models, every), sources=[src])
        spent = [0.0, 0]
        inner = agent.input.ingest

        def timed(batch: Any, s: Any = None) -> None:
            t = time.perf_counter()
            inner(batch, s)
            if not src.backfilled.is_set():
                spent[0] += time.perf_counter() - t
                spent[1] += len(batch.records)
        agent.input.ingest = timed  # type: ignore[method-assign]  # the backfill's ingest seconds
        agent.open()
        budget = 120.0 + 0.01 * events  # a generous limit of the backfill's ingest
        obs = Observer(agent, src, within, scrape_every, end=time.time() + budget + seconds)
        th = threading.Thread(target=obs.run, name="bench-observer", daemon=True)

        def stop_at_end() -> None:
            src.backfilled.wait(budget)
            obs.end = time.time() + seconds
            time.sleep(seconds)
            agent.stop()
        th.start()
        threading.Thread(target=stop_at_end, name="bench-stop", daemon=True).start()
        agent.run()
        th.join(timeout=120)
    out = dict(obs.out)
    last = [o for t, o in obs.overruns if t >= obs.overruns[-1][0] - 60.0] if obs.overruns else [0]
    took = [s[0] for s in obs.scrapes]
    out.update(models=models, rings=models * (1 + len(SEGMENTS)), rate=spent[1] / max(spent[0], 1e-9),
               records=spent[1], overruns_last_min=max(last) - min(last), scrape_s=max(took[-3:]) if took else 0.0,
               scrape_med_s=statistics.median(took) if took else 0.0,
               scrape_min_s=min(took) if took else 0.0, scrape_max_s=max(took) if took else 0.0,
               scrape_all_s=[round(t, 3) for t in took],
               metrics_bytes=obs.scrapes[-1][1] if obs.scrapes else 0,
               metrics_gzip=obs.scrapes[-1][2] if obs.scrapes else 0,
               series=obs.scrapes[-1][3] if obs.scrapes else 0)
    return out


# -- the parent ---------------------------------------------------------------------------------------------------
def run_child(models: int, args: argparse.Namespace) -> dict[str, Any] | None:
    res = run_module("benchmarks.bench_platform", "--child", models, "--events", args.events, "--rate", args.rate,
                     "--seconds", args.seconds, "--within", args.within, "--scrape", args.scrape,
                     "--seed", args.seed, *(("--every", args.every) if args.every else ()), check=False)
    if res.returncode:
        print(f"M = {models} failed (exit {res.returncode}):\n{res.stderr[-4000:]}", file=sys.stderr, flush=True)
        return None
    row: dict[str, Any] = last_json(res.stdout)
    print(f"M = {models}: load {os.getloadavg()[0]:.1f}: {json.dumps(row)}", file=sys.stderr, flush=True)
    if "cpu_within" in row:  # where the time went until the coverage was read
        print(f"M = {models}: CPU seconds from the backfill's end to the coverage ({args.within:g} s): "
              f"{row['cpu_within']}", file=sys.stderr, flush=True)
    return row


def _mb(b: float) -> str:
    return f"{b / 1e6:.2f} MB" if b >= 1e5 else f"{b / 1e3:.1f} kB"


def format_row(r: dict[str, Any], base: dict[str, Any]) -> list[str]:
    per = ", ".join(f"{t} {n}" for t, n in r.get("per_tester", {}).items())
    return [str(r["models"]), str(r["rings"]), f"{r['rate'] / 1e3:.0f}k", f"{r['rate'] / base['rate']:.2f}",
            _mb(r["state"] / r["rings"]), f"{r['metrics_bytes'] / 1e6:.2f} ({r['metrics_gzip'] / 1e6:.2f})",
            f"{r['scrape_s']:.3f}", str(r["series"]), str(r.get("windows", 0)),
            f"{100 * r.get('coverage', 0.0):.0f} %", per, str(r["rounds"]), str(r["overruns_last_min"])]


def table(rows: list[dict[str, Any]], base: dict[str, Any], within: float) -> str:
    cols = [c.format(within=f"{within:g} s") for c in COLUMNS]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
    lines += ["| " + " | ".join(format_row(r, base)) + " |" for r in rows]
    return "\n".join(lines)


def goals(rows: list[dict[str, Any]], base: dict[str, Any]) -> str:
    ms = [r for r in rows if r["models"] != 1]
    lines = ["| goal | limit | " + " | ".join(f"M = {r['models']}" for r in ms) + " |",
             "|---|---|" + "---|" * len(ms)]
    for what, limit, ok in GOALS:
        lines.append(f"| {what} | {limit} | " + " | ".join("yes" if ok(r, base) else "**no**" for r in ms) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="200", help="comma-separated model counts M (M = 1 always runs too)")
    ap.add_argument("--events", type=lambda s: int(float(s)), default=360_000,
                    help="predictions of the backfill hour, all models together (plus as many outcomes)")
    ap.add_argument("--rate", type=float, default=0.5, help="live predictions a second per model")
    ap.add_argument("--seconds", type=float, default=240.0, help="live seconds after the backfill")
    ap.add_argument("--within", type=float, default=180.0, help="coverage measured this long after the backfill")
    ap.add_argument("--scrape", type=float, default=15.0, help="seconds between scrapes")
    ap.add_argument("--every", type=float, default=None, help="evaluation.every (default: the configuration's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="M = 1, 2, a few seconds (a smoke run)")
    ap.add_argument("--docs", action="store_true", help="also write the tables into docs/performance.md")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.events, args.rate, args.seconds, args.within, args.scrape, args.every = (
            "2", 2000, 2.0, 6.0, 4.0, 1.0, 1.0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.events, args.rate, args.seconds, args.within, args.scrape,
                               args.every, args.seed)))
        return 0
    ms = [int(m) for m in args.models.split(",") if int(m) != 1]
    loads = [os.getloadavg()[0]]
    rows: list[dict[str, Any]] = []
    failed = []
    for m in [1, *ms]:
        # the same backfill at every M (as bench_models): the rates compare the same work spread over M models
        row = run_child(m, args)
        loads.append(os.getloadavg()[0])
        if row is None:
            failed.append(m)
        else:
            rows.append(row)
    if not rows or rows[0]["models"] != 1:
        print("M = 1 failed: no baseline for the ratio", file=sys.stderr)
        return 1
    head = (f"bench_platform: default configuration, 3 rings a model, backfill {args.events:,} predictions over 1 h "
            f"at every M, then {args.rate:g} predictions/s a model live for "
            f"{args.seconds:g} s; load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    tables = f"{table(rows, rows[0], args.within)}\n\n{goals(rows, rows[0])}"
    print(f"\n{head}\n\n{tables}")
    if args.docs and not failed:
        from benchmarks.docs_performance import PAGE, machine, write_page
        info = machine()
        command = "python -m benchmarks.bench_platform" + (f" --models {args.models}" if args.models != "200" else "")
        write_page("\n".join([BEGIN, f"Measured by `{command}` on {info['cpu']}, commit {info['commit']}: {head}.",
                               "", tables, END]), PAGE, BEGIN, END)
    if failed:
        print(f"\nfailed (see stderr): M = {', '.join(map(str, failed))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
