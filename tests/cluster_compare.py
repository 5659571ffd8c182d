"""Comparisons of the partitioned agent's final state with the single-process agent's and with ``calmon check``
(used by ``tests/test_cluster_kafka.py``, ``tests/test_cluster.py`` and ``benchmarks/bench_cluster.py``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from test_agent_crash import compare  # first difference between two JSON trees

ROOT = Path(__file__).resolve().parents[1]
#: models of the scenario's traffic (``test_cluster_kafka.make_traffic``)
MODELS = 24
Records = list[tuple[int, bytes | None, bytes]]


def strip_samples(node: Any) -> Any:
    """A JSON tree with every reservoir reduced to its count (samples depend on arrival order)."""
    if isinstance(node, dict):
        if node.get("format") == "calmon.reservoir":
            return {"seen": node["seen"]}
        return {k: strip_samples(v) for k, v in node.items()}
    if isinstance(node, list):
        return [strip_samples(v) for v in node]
    return node


def normalized(models: dict[str, Any], watermark: float) -> dict[str, Any]:
    """Model documents with every ring advanced to ``watermark`` and reservoir samples reduced to their counts
    (samples depend on arrival order; everything else must not)."""
    from calmon.state.buckets import ModelWindows
    out = {}
    for name, doc in models.items():
        mw = ModelWindows.from_dict(doc)
        for ring in mw.rings.values():
            ring.advance(watermark)
        out[name] = strip_samples(mw.to_dict())
    return out


def final_watermark(records: list[tuple[int, bytes | None, bytes]]) -> float:
    ts = []
    for _, _, v in records:
        try:
            ts.append(float(json.loads(v)["ts"]))
        except (ValueError, KeyError, TypeError):
            continue
    return max(ts) + 1.0


def events_by_model(counters: dict[str, Any]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for m, kind, n in counters["events"]:
        if m:
            out.setdefault(m, {})[kind] = out.setdefault(m, {}).get(kind, 0) + n
    return out


def check_reference(work: Path, records: list[tuple[int, bytes | None, bytes]]) -> dict[str, dict[str, Any]]:
    """``calmon check --json`` per model on a file of that model's records (the malformed ones it names included;
    ``--skip-invalid``): model -> its ``metrics`` (count, accuracy, Brier, ECE, l2-ECE, ...)."""
    d = work / "check"
    d.mkdir(parents=True, exist_ok=True)
    lines: dict[str, list[bytes]] = {}
    for _, _, v in records:
        try:
            model = json.loads(v).get("model")
        except (ValueError, AttributeError):
            continue
        if isinstance(model, str):
            lines.setdefault(model, []).append(v)
    out = {}
    for model, vals in sorted(lines.items()):
        path = d / f"{model}.jsonl"
        path.write_bytes(b"\n".join(vals) + b"\n")
        p = subprocess.run([sys.executable, "-m", "calmon", "check", str(path), "--json", "--skip-invalid",
                            "--tests", "none", "--bins", "256"], capture_output=True, text=True, timeout=900, cwd=ROOT)
        assert p.returncode == 0, p.stderr[-2000:]
        out[model] = json.loads(p.stdout)["metrics"]
    return out


def check_difference(checked: dict[str, dict[str, Any]], models: dict[str, Any]) -> str | None:
    """First difference between ``calmon check``'s metrics and those of the run's model documents (window
    ``all``, segment ``all``): counts exactly, metrics to 1e-9 relative."""
    from calmon.algorithms.ece import summary
    from calmon.state.buckets import ModelWindows
    if sorted(checked) != sorted(models):
        return f"models: calmon check {sorted(checked)} != run {sorted(models)}"
    for name, want in checked.items():
        got = summary(ModelWindows.from_dict(models[name]).rings["all"].window_sum(None).stats)
        for key, w in want.items():
            g = got.get(key)
            if isinstance(w, float) and isinstance(g, float) and abs(w - g) <= 1e-9 * max(1.0, abs(w)):
                continue
            if g != w:
                return f"{name}.{key}: calmon check {w!r} != run {g!r}"
    return None


def check(ref: dict[str, Any], run: dict[str, Any], records: list[tuple[int, bytes | None, bytes]],
          n_bad: int, checked: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The comparisons; returns a summary (the caller asserts on it)."""
    wm = final_watermark(records)
    owned = [set(d["models"]) for d in run["dumps"]]
    union: dict[str, Any] = {}
    for d in run["dumps"]:
        union.update(d["models"])
    events: dict[str, dict[str, int]] = {}
    for d in run["dumps"]:
        events.update(events_by_model(d["counters"]))
    dead = run["dead"]
    origins = [o for _, _, o in dead]
    return {
        "models": len(union),
        "disjoint": sum(len(o) for o in owned) == len(set().union(*owned)),
        "difference": compare(normalized(ref["state"]["models"], wm), normalized(union, wm)),
        "events_difference": compare(events_by_model(ref["state"]["counters"]), events),
        "check_difference": None if checked is None else check_difference(checked, union),
        "dead_letters": len(dead),
        "dead_unique_origins": len(set(origins)) == len(origins),
        "dead_match": sorted((v, r) for v, r, _ in dead) == ref["dead"],
        "duplicated_series": len(run["series"][0] & run["series"][1]) if len(run["series"]) == 2 else None,
        **{name: sum(float(m.group(1)) for text in run["ingest_metrics"]
                     for m in re.finditer(rf"^calmon_cluster_{name}_total{{[^}}]*}} (\S+)$", text, re.M))
           for name in ("fenced", "errors", "restores")},
        "malformed": n_bad,
    }


def identical(res: dict[str, Any]) -> bool:
    """Every comparison of :func:`check` passed."""
    return (res["models"] == MODELS and res["disjoint"] and res["difference"] is None
            and res["events_difference"] is None and res["check_difference"] in (None, "skipped")
            and res["dead_letters"] == res["malformed"] and res["dead_unique_origins"] and res["dead_match"]
            and res["duplicated_series"] == 0)
