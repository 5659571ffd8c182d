"""Delta format 4 (#33.3): one table of cells per record, built in one aggregation, merged as pending cells.

The ingest stage aggregates every bucket of a model's range at once (:func:`calmon.state.buckets.cell_table`)
and the evaluator hands each target bucket its cells to sum at its next read
(:meth:`BucketStats.merge_cells`).  The reference is the format-3 path (each bucket's grids as parts, added
at once by :meth:`BucketStats.merge_part`), itself checked against the bucket merge in
``tests/test_delta_merge.py``: the grids must hold the same integers, the samples the same counts.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from scipy import stats

from calmon.cluster.deltas import Delta, DeltaError, extract_deltas, merge_delta
from calmon.cluster.records import REASONS
from calmon.state.buckets import BucketStats, ModelWindows
from calmon.state.counters import Counters
from calmon.stats.reservoir import Reservoir

TIERS = [(60, 4), (600, 3)]


def windows(classes, levelsets=False, bins=256, segments=("web",)):
    return ModelWindows("m", classes, TIERS, segments=list(segments), bins=bins, reservoir=16,
                        levelset_lambda=4 if levelsets else None)


def random_delta(rng, classes, watermark, levelsets=False):
    """A delta of a random range: events over every tier and the archive, often more than a reservoir keeps,
    in two batches (the first at an earlier watermark, so buckets roll into coarser ones), some buckets read
    before the delta is extracted."""
    mw = windows(classes, levelsets)
    n = int(rng.integers(1, 400))
    ts = watermark - rng.exponential(rng.choice([30.0, 600.0, 5000.0]), n)
    seg = rng.choice(np.array(["web", "app"], dtype=object), n)
    y = rng.integers(0, classes, n)
    if classes == 2:
        score, probs = rng.beta(2, 2, n), None
    else:
        score, probs = None, rng.dirichlet(np.ones(classes), n)
    early = watermark - float(rng.choice([0.0, 200.0, 900.0]))
    for part, wm in ((ts <= early, early), (ts > early, watermark)):
        at = np.flatnonzero(part)
        if at.size:
            mw.add(ts[at], seg[at], y[at], None if score is None else score[at], None if probs is None else probs[at],
                   wm, predictions=bool(rng.integers(2)))
    half = n // 2
    mw.add_predictions(ts[:half], seg[:half], None if score is None else score[:half],
                       None if probs is None else probs[:half], watermark)
    for ring in mw.rings.values():
        for _t, _k, _v, b in ring.entries():
            if rng.random() < 0.2:
                _ = b.stats  # read: aggregated and materialised (cell_table's other path)
    return extract_deltas("events/0", 0, n, watermark, {"m": mw}, Counters())[0]


def contents(mw):
    """Every bucket: (segment, tier, start, its document without the sample, events seen, rows kept)."""
    out = []
    for seg, ring in sorted(mw.rings.items()):
        for tier, start, _version, b in ring.entries():
            doc = b.to_dict()
            res = doc["stats"].pop("reservoir")
            out.append((seg, tier, start, doc, res["seen"], len(b.stats.reservoir.rows)))
    return out


def read_some(rng, mw):
    for ring in mw.rings.values():
        for _t, _k, _v, b in ring.entries():
            if rng.random() < 0.5:
                _ = b.pred


@pytest.mark.parametrize("reads", [False, True])
@pytest.mark.parametrize("classes", [2, 4])
@pytest.mark.parametrize("seed", range(5))
def test_a_table_merges_to_the_format_3_merge_on_random_deltas(classes, seed, reads):
    rng = np.random.default_rng(seed)
    table, parts = windows(classes), windows(classes)
    watermark = 10_000.0
    for _ in range(int(rng.integers(3, 9))):
        watermark += float(rng.choice([0.0, 20.0, 300.0, 4000.0]))
        delta = random_delta(rng, classes, watermark)
        four = Delta.from_bytes(delta.to_bytes(4))
        assert four.table is not None and not four.buckets
        merge_delta(table, four)
        merge_delta(parts, Delta.from_bytes(delta.to_bytes(3)))
        if reads:  # reads between merges: some cells summed, others still pending
            read_some(rng, table)
    for mw in (table, parts):
        for ring in mw.rings.values():
            ring.advance(watermark + 5000.0)  # rolled alike: merged into coarser tiers and the archive
    got, want = contents(table), contents(parts)
    assert got == want
    assert sum(c[4] for c in got) > 0 and any(c[4] > 16 for c in got)  # samples that overflowed are in there


@pytest.mark.parametrize("classes", [2, 3])
def test_cell_table_is_each_bucket_as_its_own_read_would_sum_it(classes):
    """The one aggregation of a range equals every bucket's own (its grids' cells on the combined axis), leaves
    a bucket that is only its folds as it was (not aggregated nor materialised), and keeps every row of a bucket
    that fits its reservoir."""
    rng = np.random.default_rng(classes)
    delta = random_delta(rng, classes, 10_000.0)
    states = [b.bucket for b in delta.buckets]
    waiting = [(b, len(b._pending)) for b in states if b._proto is not None]
    assert waiting
    four = Delta.from_bytes(delta.to_bytes(4))
    assert all(b._proto is not None and len(b._pending) == n for b, n in waiting)  # not aggregated, not copied
    t = four.table.cells
    for i, b in enumerate(states):
        cells, sums, rows, seen = t.bucket(i)
        want_cells, want_sums = b.axis_cells()
        assert np.array_equal(cells, want_cells) and np.array_equal(sums, want_sums)
        res = b.stats.reservoir
        assert seen == res.seen and len(rows) == len(res.rows)
        if seen <= res.capacity:
            assert np.array_equal(rows, res.rows)  # every row, in order
    assert Delta.from_bytes(four.to_bytes()).to_bytes() == four.to_bytes()
    with pytest.raises(ValueError, match="version 4 only"):  # no bucket objects to write another version from
        four.to_bytes(3)


def test_a_model_with_level_sets_is_written_in_format_3_and_refuses_a_table():
    rng = np.random.default_rng(3)
    delta = random_delta(rng, 3, 10_000.0, levelsets=True)
    value = delta.to_bytes()
    assert value[4] == 3  # level sets are not in a table: the previous format carries them
    merge_delta(windows(3, levelsets=True), Delta.from_bytes(value))
    plain = random_delta(rng, 3, 10_000.0)
    target = windows(3, levelsets=True)
    with pytest.raises(DeltaError) as info:
        merge_delta(target, Delta.from_bytes(plain.to_bytes(4)))
    assert info.value.reason == "incompatible"
    assert all(not ring.entries() for ring in target.rings.values())


def frame_of(value):
    """(header document, arrays as writable numpy arrays) of an uncompressed format-4 value."""
    h, p = struct.unpack_from("<II", value, 8)
    header = json.loads(value[16:16 + h])
    payload = value[16 + h:]
    arrays, at = [], 0
    for dtype, dims in header["arrays"]:
        n = int(np.prod(dims))
        arrays.append(np.frombuffer(payload, dtype=dtype, count=n, offset=at).reshape(dims).copy())
        at += 8 * n
    return header, arrays


def reframe(header, arrays):
    header = {**header, "arrays": [["<i8" if a.dtype.kind == "i" else "<f8", list(a.shape)] for a in arrays]}
    hb = json.dumps(header, separators=(",", ":")).encode()
    payload = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
    return struct.pack("<4sBBHII", b"\x00CMD", 4, 0, 0, len(hb), len(payload)) + hb + payload


def test_a_damaged_table_is_refused_whole_with_its_reason():
    """Every damaged field of a format-4 record is a :class:`DeltaError` with a reason of ``records.REASONS``
    (never another exception) before anything is merged; a table that does not fit the model is refused whole by
    the merge."""
    rng = np.random.default_rng(5)
    delta = random_delta(rng, 2, 10_000.0)
    good = delta.to_bytes(4, compress=False)
    header, arrays = frame_of(good)
    assert Delta.from_bytes(reframe(header, arrays)).to_bytes(4, compress=False) == good  # the harness is faithful
    index_ref, starts_ref, cells_ref, sums_ref, rows_ref = header["table"]
    index = arrays[index_ref]
    first = int(np.argmax(np.diff(index[2], prepend=0) >= 2))  # a bucket of at least two cells
    a = int(index[2][first - 1]) if first else 0

    def changed(ref, edit):
        copy = [x.copy() for x in arrays]
        edit(copy[ref])
        return reframe(header, copy)

    def swap(c):
        c[a], c[a + 1] = c[a + 1], c[a]

    def put(ref, at, value):
        return changed(ref, lambda x: x.__setitem__(at, value))

    cases = [
        (put(cells_ref, a, 10 ** 6), "invalid"),  # off the combined axis
        (put(cells_ref, a, -1), "invalid"),
        (changed(cells_ref, swap), "invalid"),  # a bucket's cells out of order
        (put(sums_ref, (0, a), 0), "invalid"),  # an empty cell
        (put(index_ref, (4, first), int(index[4][first]) + 1000), "invalid"),  # rows not the sample of its events
        (put(index_ref, (2, len(index[2]) - 1), int(index[2][-1]) - 1), "invalid"),  # cells not all in buckets
        (put(index_ref, (0, 0), 7), "invalid"),  # no such segment
        (put(index_ref, (1, 0), -2), "invalid"),
        (put(rows_ref, (0, 0), np.nan), "invalid"),
        (put(starts_ref, 0, np.inf), "invalid"),
        (reframe({**header, "layout": [256, 15, 3, 20]}, arrays), "invalid"),
        (reframe({**header, "layout": None}, arrays), "invalid"),
        (reframe({**header, "layout": [256, 15, 2]}, arrays), "schema"),
        (reframe({**header, "table": [index_ref, starts_ref, cells_ref, sums_ref, 99]}, arrays), "schema"),
        (reframe({**header, "table": [rows_ref, starts_ref, cells_ref, sums_ref, index_ref]}, arrays), "schema"),
        (reframe(header, [x.reshape(1, -1) if i == cells_ref else x for i, x in enumerate(arrays)]), "schema"),
        (reframe({**header, "capacity": -1}, arrays), "schema"),
        (good[:-8], "format"),
    ]
    for bad, reason in cases:
        with pytest.raises(DeltaError) as info:
            Delta.from_bytes(bad)
        assert info.value.reason == reason and reason in REASONS, (reason, str(info.value))
    for target, reason in [(windows(2, bins=512), "incompatible"), (windows(2, segments=()), "unknown_segment")]:
        with pytest.raises(DeltaError) as info:
            merge_delta(target, Delta.from_bytes(good))
        assert info.value.reason == reason
        assert all(not ring.entries() for ring in target.rings.values())  # refused whole
    merge_delta(windows(2), Delta.from_bytes(good))


def test_merged_cells_keep_the_sample_uniform():
    """A bucket that receives every event of two delta buckets (rows pending until its read) and the sample of a
    third (absorbed at once) holds a uniform sample of the union: chi-square of each event's inclusion frequency
    over trials, and of how many events of each part it holds against the hypergeometric law."""
    cap, trials = 8, 3000
    parts = [np.arange(0, 5), np.arange(5, 35), np.arange(35, 41)]  # the middle one overflows its reservoir
    total = 41
    hits = np.zeros(total)
    from_middle = np.zeros(cap + 1)
    for trial in range(trials):
        bucket = BucketStats(2, bins=64, reservoir=cap, seed=trial)
        for k, ids in enumerate(parts):
            rows = np.column_stack([ids / 100.0, np.zeros(ids.size)])
            cells = np.array([0])
            sums = np.array([[ids.size], [0], [0], [0], [0], [0]])
            if ids.size > cap:
                res = Reservoir(cap, 2, seed=10_000 + trial)
                res.update(rows)
                rows = res.rows
            bucket.merge_cells(cells, sums, rows, int(ids.size), cap)
            if k == 0:
                assert bucket._pending  # waiting for the read
        kept = np.rint(bucket.stats.reservoir.rows[:, 0] * 100).astype(int)
        assert bucket.stats.reservoir.seen == total and len(set(kept.tolist())) == cap
        hits[kept] += 1
        from_middle[np.isin(kept, parts[1]).sum()] += 1
    expected = np.full(total, trials * cap / total)
    assert stats.chisquare(hits, expected).pvalue > 1e-3
    law = stats.hypergeom(total, parts[1].size, cap).pmf(np.arange(cap + 1)) * trials
    keep = law > 5
    observed = np.append(from_middle[keep], from_middle[~keep].sum())
    want = np.append(law[keep], law[~keep].sum())
    assert stats.chisquare(observed, want * observed.sum() / want.sum()).pvalue > 1e-3
