"""Fuzz: files of every format with hostile records and garbage files, through the agent (issue #31, build 8).

Hypothesis builds a *mess*: clean events spread over JSON Lines (plain, gzip, zstd), CSV and Parquet files, with
records that must be rejected inserted anywhere, and files that are garbage whole (random bytes behind a gzip or
zstd magic or named ``.parquet``, a truncated gzip stream, a gzip bomb). The agent replays it in this process, and
its *clean twin* (the same files without the hostile records and the garbage files). Invariants:

* the agent finishes (no exception, no endless polling);
* every record read is accounted for: accepted + rejected by reason = read, and one dead letter per rejection,
  each with a reason code of the decoder's;
* the state (every ring, the join buffers, the decoder's admitted models) equals the clean twin's, and so do the
  accepted events: a hostile record or file costs exactly itself;
* memory stays bounded (the process's peak RSS).

CI runs a few examples (``CALMON_FUZZ_EXAMPLES``, default 12); ``python -m benchmarks.fuzz`` runs them at length.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calmon.events.decoder import REASONS
from tests.fuzz import fuzzkit as fk

FORMATS = ("jsonl", "jsonl.gz", "jsonl.zst", "csv", "parquet")
SUFFIX = {"jsonl": "jsonl", "jsonl.gz": "jsonl.gz", "jsonl.zst": "jsonl.zst", "csv": "csv", "parquet": "parquet"}
GARBAGE = {"random_gz": "jsonl.gz", "random_zst": "jsonl.zst", "random_parquet": "parquet",
           "truncated_gz": "jsonl.gz", "bomb_gz": "jsonl.gz"}
RSS_BOUND_MIB = 1024  # the suite's process: interpreter, numpy, pyarrow, hypothesis and the agent


@st.composite
def messes(draw: st.DrawFn) -> tuple[list[fk.Part], list[fk.Garbage]]:
    seed = draw(st.integers(0, 2**31 - 1))
    events = fk.clean_events(seed, draw(st.integers(1, 150)), models=draw(st.integers(1, 4)))
    cuts = sorted(draw(st.lists(st.integers(0, len(events)), max_size=4)))
    chunks = [events[a:b] for a, b in zip([0, *cuts], [*cuts, len(events)], strict=True)]
    parts: list[fk.Part] = []
    for i, chunk in enumerate(chunks):
        fmt = draw(st.sampled_from(FORMATS))
        kinds = st.sampled_from(sorted(fk.HOSTILE_LINES)) if fmt.startswith("jsonl") else st.just("row")
        hostile = draw(st.lists(st.tuples(st.integers(0, len(chunk)), kinds, st.integers(0, 500)),
                                max_size=12))
        parts.append(fk.Part(f"p{i:02d}.{SUFFIX[fmt]}", fmt, chunk, hostile))
    garbage_kinds = draw(st.lists(st.sampled_from(sorted(GARBAGE)), max_size=3))
    if "bomb_gz" in garbage_kinds and not draw(st.integers(0, 3)) == 0:  # bombs cost a second each: keep few
        garbage_kinds = [k for k in garbage_kinds if k != "bomb_gz"]
    # Garbage files sort after the clean ones of their source: a bomb takes several reads of its source, which
    # would change how the sources' batches interleave, and with it the order of equal-time events in a reservoir.
    garbage = [fk.Garbage(f"zz{i:02d}.{GARBAGE[k]}", k, draw(st.integers(0, 10**6)))
               for i, k in enumerate(garbage_kinds)]
    return parts, garbage


def _accounted(r: fk.Replay) -> None:
    read = sum(r.counters["records"].values())
    accepted = sum(n for _m, _k, n in r.counters["events"])
    rejected = sum(r.counters["rejected"].values())
    assert accepted + rejected == read, (accepted, rejected, read, r.counters)
    assert len(r.dead_letters) == rejected, (len(r.dead_letters), r.counters["rejected"])
    reasons = {d.get("reason") for d in r.dead_letters}
    assert reasons <= set(REASONS), reasons - set(REASONS)


@pytest.fixture(scope="module", autouse=True)
def _peak_from_here() -> None:
    fk.reset_peak_rss()  # the bound is this suite's peak, not that of the modules the worker ran before


@settings(max_examples=fk.env_examples(12), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(messes())
def test_a_mess_costs_exactly_its_hostile_records_and_files(mess):
    parts, garbage = mess
    dirty, clean = fk.fresh_dir("calmon-fuzz-dirty-"), fk.fresh_dir("calmon-fuzz-clean-")
    for part in parts:
        fk.write_part(part, dirty, with_hostile=True)
        fk.write_part(part, clean, with_hostile=False)
    for g in garbage:
        fk.write_garbage(g, dirty)
    got, want = fk.replay(dirty), fk.replay(clean)
    hostile = sum(len(p.hostile) for p in parts)
    fk.STATS["records"] += sum(want.counters["records"].values()) + hostile
    fk.STATS["hostile"] += hostile
    fk.STATS["files"] += len(parts) + len(garbage)

    _accounted(got)
    _accounted(want)
    assert not want.counters["rejected"], want.counters["rejected"]
    assert sorted(got.counters["events"]) == sorted(want.counters["events"])
    assert sum(got.counters["rejected"].values()) >= hostile
    assert got.state == want.state
    assert fk.rss_mib() < RSS_BOUND_MIB
