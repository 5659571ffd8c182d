"""The batched window sums (``summed``, ``Plan.run``) equal copies merged pairwise, bit for bit.

The reference is computed here independently, by the definition of :mod:`calmon.state.windows`: per window,
a fresh state into which the window's stable buckets are merged newest first, then the archive (``all``),
then the hot buckets newest first -- one ``merge`` per bucket.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from calmon.state import windows
from calmon.state.buckets import BucketStats, ModelWindows
from calmon.state.windows import HOT, RingSums, TieredRing, capture
from calmon.stats.grid import ScoreGrid
from calmon.stats.model import ModelStats
from calmon.stats.reservoir import Reservoir

TIERS = [(60.0, 5), (600.0, 3), (3600.0, 2)]
LENGTHS = {"2m": 120.0, "5m": 300.0, "30m": 1800.0, "2h": 7200.0, "all": None}


def _pairwise(base: Any, others: list[Any]) -> Any:
    out = base.copy()
    for o in others:
        out.merge(o)
    return out


def _grid(rng: np.random.Generator, bins: int, n: int, channels: int | None = None) -> ScoreGrid:
    g = ScoreGrid(bins, channels)
    if n:
        shape = (n,) if channels is None else (n, channels)
        g.update(rng.random(shape) ** 3, (rng.random(shape) < 0.5).astype(float))
    return g


@pytest.mark.parametrize("seed", range(6))
def test_grid_summed_equals_pairwise_merges_values_and_storage(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for bins, channels in [(1024, None), (64, None), (15, None), (128, 3)]:
        sizes = rng.choice([0, 1, 5, 40, 400], size=int(rng.integers(1, 7)))
        grids = [_grid(rng, bins, int(n), channels) for n in sizes]
        before = [g._all().copy() for g in grids]
        got, want = grids[0].summed(grids[1:]), _pairwise(grids[0], grids[1:])
        assert np.array_equal(got._all(), want._all()) and got.is_sparse == want.is_sparse
        assert all(np.array_equal(g._all(), b) for g, b in zip(grids, before))  # nothing changed
        got.merge(grids[0])  # the result owns its storage
        assert all(np.array_equal(g._all(), b) for g, b in zip(grids, before))


def test_reservoir_merged_equals_algorithm_by_hand() -> None:
    rng = np.random.default_rng(3)
    a, b = Reservoir(8, 2, seed=1), Reservoir(8, 2, seed=2)
    a.update(rng.random((20, 2)))
    b.update(rng.random((5, 2)))
    out = a.merged(b, np.random.default_rng(7))
    g = np.random.default_rng(7)  # the draws of merged(), written out
    seed = int(g.integers(2**63))
    k_a = int(g.hypergeometric(20, 5, 8))
    rows = np.vstack([a.rows[g.permutation(8)[:k_a]], b.rows[g.permutation(5)[:8 - k_a]]])[g.permutation(8)]
    assert out._seed == seed and out.seen == 25 and np.array_equal(out.rows, rows)
    copy = a.sample_copy()
    assert copy.seen == a.seen and np.array_equal(copy.rows, a.rows) and copy.rows is not a.rows


@pytest.mark.parametrize("classes", [2, 4])
def test_model_stats_summed_equals_pairwise_merges(classes: int) -> None:
    rng = np.random.default_rng(classes)
    states = []
    for _ in range(6):
        s = ModelStats(classes, bins=64, reservoir=8, levelset_lambda=4 if classes > 2 else None)
        n = int(rng.integers(0, 30))
        if classes == 2:
            s.update(score=rng.random(n), labels=rng.integers(0, 2, n))
        else:
            s.update(probs=rng.dirichlet(np.ones(classes), n), labels=rng.integers(0, classes, n))
        states.append(s)
    before = [s.to_dict() for s in states]
    got, want = states[0].summed(states[1:]), _pairwise(states[0], states[1:])
    assert got.to_dict() == want.to_dict()  # grids, reservoir rows and generator state, level sets
    assert [s.to_dict() for s in states] == before


def _add(mw: ModelWindows, rng: np.random.Generator, now: float) -> None:
    n = int(rng.integers(1, 40))
    ts = now - rng.exponential(900.0 if rng.random() < 0.3 else 40.0, n)
    seg = np.where(rng.random(n) < 0.5, "web", "app").astype(object)
    z = rng.random(n)
    mw.add(ts, seg, (rng.random(n) < z).astype(np.int64), z, None, now)


def _by_definition(ring: TieredRing[Any], lengths: dict[str, float | None], wm: float) -> dict[str, Any]:
    """Window sums by the module's definition, one merge per bucket into a fresh state (no copies kept)."""
    w0 = ring.tiers[0][0]
    cur = math.floor(wm / w0) * w0
    hot_from = cur - (HOT - 1) * w0
    hot: list[tuple[float, Any]] = []
    stable: list[tuple[float, Any]] = []
    for t, tier in enumerate(ring.buckets):
        for key, state in tier.items():
            (hot if t == 0 and key >= hot_from else stable).append((key, state))
    out = {}
    for name, length in lengths.items():
        cutoff = -math.inf if length is None else cur + w0 - length
        acc = ring.factory()
        for _, state in sorted(((k, s) for k, s in stable if k >= cutoff), key=lambda kv: -kv[0]):
            acc.merge(state)
        if length is None and ring.archive is not None:
            acc.merge(ring.archive)
        for _, state in sorted(((k, s) for k, s in hot if k >= cutoff), key=lambda kv: -kv[0]):
            acc.merge(state)
        out[name] = acc
    return out


@pytest.mark.parametrize("seed", range(3))
def test_batched_incremental_sums_equal_the_definition_and_the_reference_path(seed: int) -> None:
    rng = np.random.default_rng(seed)
    mw = ModelWindows("m", 2, TIERS, segments=["web"], bins=64, reservoir=16)
    kept: dict[str, RingSums | None] = {}
    kept_ref: dict[str, RingSums | None] = {}
    for _ in range(30):
        now = 10_000.0 + float(rng.integers(0, 50)) * 37.0 + _ * 120.0
        _add(mw, rng, now)
        wm = max(now, max(r.watermark for r in mw.rings.values()))
        for seg, ring in mw.rings.items():
            want = {k: v.to_dict() for k, v in _by_definition(ring, LENGTHS, wm).items()}
            sums, kept[seg] = capture(ring, LENGTHS, wm, kept.get(seg), BucketStats.read_copy).run()
            plan = capture(ring, LENGTHS, wm, kept_ref.get(seg), BucketStats.copy)
            ref, kept_ref[seg] = plan.run_reference()
            assert {k: v.to_dict() for k, v in sums.items()} == want
            assert {k: v.to_dict() for k, v in ref.items()} == want


def test_reference_path_injected_into_the_snapshot_gives_the_same_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy-and-merge path put in place of :meth:`Plan.run` (as a benchmark compares the two) gives every
    snapshot window the batched path gives."""
    def snapshots() -> list[tuple[str, str, str, dict[str, Any]]]:
        st = _state([{"width": "1m", "count": 5}, {"width": "10m", "count": 3}, {"width": "1h", "count": 2}])
        rng = np.random.default_rng(5)
        out = []
        for now in (20_000.0, 20_045.0, 20_700.0):
            with st.lock:
                _add(st.windows_of("m", 2), rng, now)
            out += [(s.model, s.segment, s.window, s.bucket.to_dict()) for s in st.snapshot()]
        return sorted(out, key=lambda s: s[:3])

    batched = snapshots()
    calls: list[int] = []

    def reference(plan: windows.Plan) -> Any:
        calls.append(1)
        return plan.run_reference()

    monkeypatch.setattr(windows.Plan, "run", reference)
    assert snapshots() == batched and calls


def test_cached_seeding_gives_default_rng_streams() -> None:
    from calmon.stats.model import _generator, _seeded_state
    for n in (0, 7, 256, 10**6, 2**40):
        gen = _generator()
        gen.bit_generator.state = _seeded_state(n)
        ref = np.random.default_rng(n)
        assert gen.integers(2**63) == ref.integers(2**63)
        assert gen.permutation(50).tolist() == ref.permutation(50).tolist()
        gen.bit_generator.state = _seeded_state(n)  # the cached state was not changed by its use
        assert gen.integers(2**63) == np.random.default_rng(n).integers(2**63)


def _merged_by_hand(a: Reservoir, b: Reservoir, seed: int) -> tuple[Reservoir, dict[str, Any]]:
    """``a.merged(b, default_rng(seed))`` as the documented draws, in full (and the generator's state after)."""
    g = np.random.default_rng(seed)
    out = Reservoir(max(a.capacity, b.capacity), a.width)
    out._seed = int(g.integers(2**63))
    out.seen = a.seen + b.seen
    take = min(out.capacity, out.seen)
    if take:
        k_a = int(g.hypergeometric(a.seen, b.seen, take)) if a.seen and b.seen else (take if a.seen else 0)
        rows = np.concatenate([a.rows[g.permutation(len(a.rows))[:k_a]],
                               b.rows[g.permutation(len(b.rows))[:take - k_a]]])[g.permutation(take)]
        out._data = rows
    return out, dict(g.bit_generator.state)


@pytest.mark.parametrize(("n_a", "n_b", "cap"), [(0, 0, 8), (0, 5, 8), (5, 0, 8), (3, 4, 8), (4, 4, 8), (20, 0, 8),
                                                 (20, 5, 8), (5, 20, 8), (300, 900, 256), (100, 100, 256),
                                                 (2, 9, 1), (1, 1, 1)])
def test_reservoir_merged_takes_the_documented_draws(n_a: int, n_b: int, cap: int) -> None:
    rng = np.random.default_rng(n_a * 1000 + n_b)
    a, b = Reservoir(cap, 2, seed=1), Reservoir(cap, 2, seed=2)
    a.update(rng.random((n_a, 2)))
    b.update(rng.random((n_b, 2)))
    for seed in (0, 7, 12345, 2**40 + 3):
        gen = np.random.default_rng(seed)
        got = a.merged(b, gen)
        want, state = _merged_by_hand(a, b, seed)
        assert (got._seed, got.seen, got.capacity) == (want._seed, want.seen, want.capacity)
        assert got.rows.shape == want.rows.shape and np.array_equal(got.rows, want.rows)
        assert gen.bit_generator.state == state  # the same draws were taken, no more


def _state(tiers: list[dict[str, Any]]) -> Any:
    from calmon.config import build_config
    from calmon.state.agentstate import AgentState
    return AgentState(build_config({
        "sources": [{"path": "x.jsonl"}],
        "windows": {"names": ["2m", "30m", "2h", "all"], "tiers": tiers, "allowed_lateness": "2h"},
        "models": {"default": {"bins": 64, "reservoir": 16, "segments": ["web"]}}}, env={}))


def test_snapshot_equals_the_definition_over_rounds_with_an_evicted_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several snapshots with new events in between (rolls and late events), a busy model with many buckets, a
    sparse one with few, and a model evicted then seen again: every window equals the definition, bit for bit,
    and the garbage collector is paused while the sums run (and restored after)."""
    import gc

    st = _state([{"width": "1m", "count": 5}, {"width": "10m", "count": 3}, {"width": "1h", "count": 2}])
    lengths = st.windows
    rng = np.random.default_rng(11)
    paused: list[bool] = []
    run = windows.Plan.run

    def spy(plan: Any) -> Any:
        paused.append(not gc.isenabled())
        return run(plan)

    monkeypatch.setattr(windows.Plan, "run", spy)
    now = 20_000.0
    for rnd in range(12):
        now += float(rng.choice([10.0, 45.0, 61.0, 700.0]))
        with st.lock:
            for name, p in (("busy", 1.0), ("sparse", 0.25), ("gone", 0.6)):
                if rng.random() < p:
                    _add(st.windows_of(name, 2), rng, now)
            if rnd == 6:
                del st.models["gone"]  # evicted: its windows and kept sums go
        snaps = st.snapshot()
        assert gc.isenabled()
        names = sorted(st.models)
        assert sorted({s.model for s in snaps}) == names
        assert len(snaps) == sum(len(st.models[n].rings) for n in names) * len(lengths)
        for s in snaps:
            ring = st.models[s.model].rings[s.segment]
            want = _by_definition(ring, lengths, ring.watermark)[s.window]
            assert s.bucket.to_dict() == want.to_dict(), (rnd, s.model, s.segment, s.window)
        assert set(st._snap_cache) == {(n, seg) for n in names for seg in st.models[n].rings}
    assert paused and all(paused)
    buckets = {n: sum(len(t) for t in st.models[n].rings["all"].buckets) for n in ("busy", "sparse")}
    assert buckets["busy"] > buckets["sparse"] >= 1
