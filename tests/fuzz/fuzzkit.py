"""The fuzz suite's harness: clean events, records that must be rejected, files of every format, and a replay.

A *mess* is a set of input files, each a format (JSON Lines plain or compressed, CSV, Parquet) holding clean events
with hostile records mixed in, plus files that are garbage whole (random bytes named like a compressed or Parquet
file, truncated streams, bombs). :func:`replay` runs the agent in this process over a directory of them to the end
(``ingest.exit_when_done``) and returns what the invariants need: the state document, the counters, the dead
letters and the source's whole-file rejections. The *clean twin* of a mess is the same files with every hostile
record and every garbage file left out: the agent must end in the same state on both.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z: the events' times
CLOCK = 1_767_400_000.0  # the agent's wall clock: after every event, so none is "in the future"
MAX_RECORD_BYTES = 4096

#: Statistics kept by the replay (the long run prints them): records fed, replays, seconds.
STATS: dict[str, float] = {"records": 0, "hostile": 0, "files": 0, "replays": 0, "seconds": 0.0}


# ----------------------------------------------------------------------------------------------- clean events
def clean_events(seed: int, n: int, models: int = 2) -> list[dict[str, Any]]:
    """``n`` events that every decoder accepts: labeled events and prediction/outcome pairs (the outcome right
    after its prediction, so the join does not depend on how the events are spread over files)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    i = 0
    while len(out) < n:
        model = f"m{int(rng.integers(models))}"
        score = round(float(rng.uniform()), 6)
        label = int(rng.uniform() < score)
        ts = T0 + 7 * i
        if rng.uniform() < 0.6:
            out.append({"type": "labeled", "id": f"l{seed}-{i}", "model": model, "ts": ts, "score": score,
                        "label": label})
        else:
            out.append({"type": "prediction", "id": f"p{seed}-{i}", "model": model, "ts": ts, "score": score})
            out.append({"type": "outcome", "id": f"p{seed}-{i}", "model": model, "ts": ts + 3, "label": label})
        i += 1
    return out[:n] if out[-1]["type"] != "outcome" or len(out) <= n else out


# ------------------------------------------------------------------------------------- records to be rejected
def _valid() -> dict[str, Any]:
    return {"type": "labeled", "id": "h", "model": "m0", "ts": T0 + 1, "score": 0.5, "label": 1}


def _with(**kw: Any) -> bytes:
    ev = _valid()
    for k, v in kw.items():
        if v is _DROP:
            ev.pop(k)
        else:
            ev[k] = v
    return json.dumps(ev).encode()


_DROP = object()

#: Kinds of JSON Lines record that must be rejected, each a function of a seed (an int) to the record's bytes.
HOSTILE_LINES: dict[str, Callable[[int], bytes]] = {
    "not_json": lambda s: b"\x00{" + bytes((s * 37 + k) % 256 for k in range(s % 23)).replace(b"\n", b" "),
    "truncated": lambda s: _with(id=f"t{s}")[: 1 + s % 60],
    "not_an_object": lambda s: json.dumps([s, "a", None]).encode(),
    "score_out_of_range": lambda s: _with(score=1.5 + s),
    "score_string": lambda s: _with(score=f"0.{s}"),
    "score_nan": lambda s: b'{"type":"labeled","id":"h","model":"m0","ts":%d,"score":NaN,"label":1}' % (T0 + s),
    "label_not_a_class": lambda s: _with(label=7 + s),
    "unknown_type": lambda s: _with(type=f"guess{s}"),
    "bad_model_name": lambda s: _with(model=f"bad model {s}!"),
    "model_not_a_string": lambda s: _with(model=[s]),
    "time_garbage": lambda s: _with(ts=f"soon{s}"),
    "far_future": lambda s: _with(ts=time.time() + 1e8 + s),  # the decoder checks against the real clock
    "missing_score": lambda s: _with(score=_DROP),
    "deep_nesting": lambda s: b'{"model":"m0","x":' + b"[" * (2000 + s) + b"]" * (2000 + s) + b',"score":0.5}',
    "oversized": lambda s: _with(pad="x" * (MAX_RECORD_BYTES + s)),
    "invalid_utf8": lambda s: _with(id="u").replace(b'"u"', b'"\xff\xfe%d"' % s),
}


# ------------------------------------------------------------------------------------------------- the files
@dataclass
class Part:
    """One input file: a format, its clean events, and hostile records to insert before given positions."""

    name: str
    fmt: str  # "jsonl", "jsonl.gz", "jsonl.zst", "csv", "parquet"
    events: list[dict[str, Any]]
    hostile: list[tuple[int, str, int]] = field(default_factory=list)  # (before index, kind, seed)


@dataclass
class Garbage:
    """A file that is garbage whole: ``kind`` in ``random_gz``, ``random_zst``, ``random_parquet``,
    ``truncated_gz``, ``bomb_gz``."""

    name: str
    kind: str
    seed: int


#: One file source per glob (source name -> glob in the mess's directory).
SOURCE_GLOBS = {"jsonl": "*.jsonl", "gz": "*.jsonl.gz", "zst": "*.jsonl.zst", "csv": "*.csv", "parquet": "*.parquet"}

CSV_COLUMNS = ("type", "id", "model", "ts", "score", "label")


def _csv_cell(v: Any) -> str:
    return "" if v is None else str(v)


def _lines(part: Part, with_hostile: bool) -> list[bytes]:
    lines = [json.dumps(e).encode() for e in part.events]
    if with_hostile:
        for pos, kind, seed in sorted(part.hostile, reverse=True):
            lines.insert(min(pos, len(lines)), HOSTILE_LINES[kind](seed))
    return lines


def write_part(part: Part, directory: Path, with_hostile: bool) -> None:
    """Write ``part`` into ``directory`` (its hostile records left out when ``with_hostile`` is false)."""
    path = directory / part.name
    if part.fmt in ("jsonl", "jsonl.gz", "jsonl.zst"):
        data = b"".join(line + b"\n" for line in _lines(part, with_hostile))
        if part.fmt == "jsonl.gz":
            data = gzip.compress(data, mtime=0)
        elif part.fmt == "jsonl.zst":
            import zstandard
            data = zstandard.ZstdCompressor().compress(data)
        path.write_bytes(data)
    elif part.fmt == "csv":
        rows = [",".join(_csv_cell(e.get(c)) for c in CSV_COLUMNS) for e in part.events]
        if with_hostile:  # CSV hostile rows: a value that is no number, a score out of range, too few cells
            bad = {0: "labeled,h,m0,%d,abc,1", 1: "labeled,h,m0,%d,3.5,1", 2: "labeled,h,m0,%d"}
            for pos, _kind, seed in sorted(part.hostile, reverse=True):
                rows.insert(min(pos, len(rows)), bad[seed % 3] % (T0 + seed))
        path.write_text(",".join(CSV_COLUMNS) + "\n" + "".join(r + "\n" for r in rows))
    elif part.fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        events = list(part.events)
        if with_hostile:  # Parquet is typed: the hostile rows are a score out of range and a missing score
            for pos, _kind, seed in sorted(part.hostile, reverse=True):
                ev = dict(_valid(), id=f"q{seed}", score=None if seed % 2 else 2.0 + seed)
                events.insert(min(pos, len(events)), ev)
        cols = {c: [e.get(c) for e in events] for c in CSV_COLUMNS}
        table = pa.table({"type": pa.array(cols["type"], pa.string()), "id": pa.array(cols["id"], pa.string()),
                          "model": pa.array(cols["model"], pa.string()), "ts": pa.array(cols["ts"], pa.float64()),
                          "score": pa.array(cols["score"], pa.float64()), "label": pa.array(cols["label"], pa.int64())})
        pq.write_table(table, path, row_group_size=max(1, len(events) // 3 or 1))
    else:
        raise ValueError(part.fmt)


def write_garbage(g: Garbage, directory: Path) -> None:
    import numpy as np
    rng = np.random.default_rng(g.seed)
    path = directory / g.name
    if g.kind == "random_gz":
        path.write_bytes(b"\x1f\x8b" + rng.bytes(int(rng.integers(0, 3000))))
    elif g.kind == "random_zst":
        path.write_bytes(b"\x28\xb5\x2f\xfd" + rng.bytes(int(rng.integers(0, 3000))))
    elif g.kind == "random_parquet":
        path.write_bytes(rng.bytes(int(rng.integers(0, 3000))) + (b"PAR1" if g.seed % 2 else b""))
    elif g.kind == "truncated_gz":  # hostile lines only, so the clean twin simply lacks the file
        data = b"".join(HOSTILE_LINES["not_json"](g.seed + k) + b"\n" for k in range(40))
        blob = gzip.compress(data, mtime=0)
        path.write_bytes(blob[: max(11, len(blob) * (1 + g.seed % 9) // 10)])
    elif g.kind == "bomb_gz":  # a few hostile lines, then 72 MiB of zeros: beyond the expansion cap
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0) as z:
            z.write(b"".join(HOSTILE_LINES["not_json"](g.seed + k) + b"\n" for k in range(3)))
            chunk = bytes(1 << 20)
            for _ in range(72):
                z.write(chunk)
        path.write_bytes(buf.getvalue())
    else:
        raise ValueError(g.kind)


# ------------------------------------------------------------------------------------------------- the replay
@dataclass
class Replay:
    """What one replay of a directory left: the state without its counters, the counters, the dead letters."""

    state: dict[str, Any]
    counters: dict[str, Any]
    dead_letters: list[dict[str, Any]]
    rejected_files: dict[str, int]
    file_errors: list[str]
    polls: int


def replay(directory: Path, mapping: Any = None, options: dict[str, Any] | None = None,
           max_polls: int = 10_000) -> Replay:
    """Run the agent in this process over every file of ``directory`` to the end and return what it left."""
    from calmon.agent.runtime import Agent
    from calmon.config import build_config
    work = Path(tempfile.mkdtemp(prefix="calmon-fuzz-"))
    dead = work / "dead.jsonl"
    sources: list[dict[str, Any]] = []
    for name, glob in SOURCE_GLOBS.items():  # compressed files are read only where a glob names their suffix
        source: dict[str, Any] = {"name": name, "path": str(directory / glob), "options": {**(options or {})}}
        if mapping is not None:
            source["schema"] = mapping
        sources.append(source)
    cfg = build_config({
        "state_dir": str(work / "state"), "sources": sources,
        "models": {"default": {"bins": 256, "reservoir": 64}},
        "limits": {"max_record_bytes": MAX_RECORD_BYTES},
        "join": {"ttl": "30d"},
        "evaluation": {"every": "1h"}, "dead_letter": {"path": str(dead)}, "exporter": {"enabled": False},
        "checkpoint": {"every": "1h"}, "ingest": {"exit_when_done": True},
    }, env={})
    started = time.perf_counter()
    agent = Agent(cfg, clock=lambda: CLOCK)
    agent.open()
    try:
        polls = 0
        while agent.poll_once():
            polls += 1
            if polls > max_polls:
                raise AssertionError(f"the agent did not finish {directory} in {max_polls} polls")
        doc = agent.state.to_doc()
        rejected_files: dict[str, int] = {}
        errors: list[str] = []
        for src in getattr(agent, "sources", []) or []:
            rejected_files.update(getattr(src, "rejected_files", {}) or {})
            errors.extend(getattr(src, "errors", []) or [])
    finally:
        agent.close()
    letters = [json.loads(line) for line in dead.read_text().splitlines()] if dead.exists() else []
    shutil.rmtree(work, ignore_errors=True)
    STATS["replays"] += 1
    STATS["seconds"] += time.perf_counter() - started
    counters = doc.pop("counters")
    return Replay(doc, counters, letters, rejected_files, errors, polls)


def fresh_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def reset_peak_rss() -> bool:
    """Start measuring this process's peak resident set afresh (Linux: ``clear_refs`` 5 resets ``VmHWM``).

    A pytest-xdist worker runs many modules: its lifetime peak is the largest of any of them, not this suite's.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def rss_mib() -> float:
    """This process's peak resident set (MiB) since :func:`reset_peak_rss` (``VmHWM``), else since it started."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def env_examples(default: int) -> int:
    """Examples per property: ``CALMON_FUZZ_EXAMPLES`` (the long run) or ``default`` (CI)."""
    return int(os.environ.get("CALMON_FUZZ_EXAMPLES", default))
