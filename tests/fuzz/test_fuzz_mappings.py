"""Fuzz: schema mappings over records of a foreign shape, through the agent (issue #31, builds 2 and 8).

Hypothesis draws records of a team's own shape (nested keys, times in seconds or milliseconds or RFC 3339, labels
as integers, booleans or strings, with foreign records mixed in) and a mapping of calmon's fields onto paths that
may or may not exist in them. Invariants:

* a mapping is refused at start with ONE line naming the key (``ConfigError``), or the agent runs to the end:
  data never turns a mapping into an exit (a path absent from the records seen is a warning, never a crash);
* every record is accounted for (accepted + rejected by reason = read) with one dead letter per rejection;
* the mapping that describes the records exactly accepts every record that is not foreign.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calmon.config import ConfigError
from tests.fuzz import fuzzkit as fk

PATHS = ["rid", "meta.model", "meta.country", "p", "y", "when", "kind", "nope", "meta.nope", "/meta/model", "p.x"]


@st.composite
def shaped(draw: st.DrawFn) -> tuple[list[bytes], int, dict]:
    """Records of one foreign shape (and how many of them are foreign), and the mapping describing them."""
    n = draw(st.integers(1, 60))
    unit = draw(st.sampled_from(["s", "ms", "iso"]))
    label_style = draw(st.sampled_from(["int", "bool", "yesno"]))
    recs: list[bytes] = []
    foreign = 0
    for i in range(n):
        if draw(st.integers(0, 9)) == 0:
            recs.append(json.dumps({"unrelated": i, "meta": draw(st.sampled_from([None, 3, "x", {}]))}).encode())
            foreign += 1
            continue
        t = fk.T0 + 5 * i
        when: object = t if unit == "s" else t * 1000 if unit == "ms" else f"2026-01-01T00:{(5 * i) // 60 % 60:02d}:" \
                                                                              f"{(5 * i) % 60:02d}Z"
        y = i % 2
        label: object = y if label_style == "int" else bool(y) if label_style == "bool" else ("yes" if y else "no")
        recs.append(json.dumps({"rid": f"r{i}", "meta": {"model": "churn", "country": "de"}, "p": round(0.1 + 0.8 * (
            i % 7) / 6, 3), "y": label, "when": when, "kind": "labeled"}).encode())
    exact = {"fields": {"id": "rid", "model": "meta.model", "segment": "meta.country", "score": "p", "label": "y",
                        "ts": "when", "type": "kind"}, "ts_unit": unit}
    if label_style == "yesno":
        exact["labels"] = {"positive": ["yes"], "negative": ["no"]}
    return recs, foreign, exact


@st.composite
def mutated(draw: st.DrawFn, exact: dict) -> dict:
    """``exact`` with some fields moved to other paths, dropped or made constant, and sections changed."""
    m = json.loads(json.dumps(exact))
    for name in draw(st.lists(st.sampled_from(sorted(m["fields"])), min_size=1, max_size=4, unique=True)):
        m["fields"][name] = draw(st.sampled_from([*PATHS, None, {"const": "churn"}, {"const": 0.5}, ""]))
    if draw(st.booleans()):
        m["ts_unit"] = draw(st.sampled_from(["auto", "s", "ms", "us", "ns", "iso", "weeks"]))
    if draw(st.integers(0, 3)):  # mostly a probe shorter than the input: where a probe could stop the agent
        m["probe_records"] = draw(st.sampled_from([0, 1, 5, 20, 1000, -1]))
    if draw(st.integers(0, 4)) == 0:
        m["types"] = {"labeled": draw(st.sampled_from(["labeled", "lbl", 3]))}
    return m


def _source_dir(recs: list[bytes]):
    d = fk.fresh_dir("calmon-fuzz-map-")
    (d / "events.jsonl").write_bytes(b"".join(r + b"\n" for r in recs))
    return d


def _accounted(r: fk.Replay) -> tuple[int, int]:
    read = sum(r.counters["records"].values())
    accepted = sum(n for _m, _k, n in r.counters["events"])
    rejected = sum(r.counters["rejected"].values())
    assert accepted + rejected == read and len(r.dead_letters) == rejected, r.counters
    return accepted, read


@settings(max_examples=fk.env_examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_mapping_is_refused_in_one_line_or_never_stops_the_agent(data):
    recs, _foreign, exact = data.draw(shaped())
    mapping = data.draw(mutated(exact))
    fk.STATS["records"] += len(recs)
    try:
        r = fk.replay(_source_dir(recs), mapping=mapping)
    except ConfigError as exc:
        msg = str(exc)
        assert "\n" not in msg and "schema" in msg, msg
        return
    _accounted(r)


@settings(max_examples=fk.env_examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shaped())
def test_the_exact_mapping_accepts_every_record_that_is_not_foreign(case):
    recs, foreign, exact = case
    fk.STATS["records"] += len(recs)
    r = fk.replay(_source_dir(recs), mapping=exact)
    accepted, read = _accounted(r)
    assert read == len(recs) and accepted == len(recs) - foreign, (accepted, read, foreign, r.counters)
