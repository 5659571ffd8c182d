import base64
import json
import zlib

import numpy as np
from scipy import stats

from calmon.stats.reservoir import Reservoir


def test_independent_of_batch_boundaries_and_round_trips():
    x = np.column_stack([np.arange(20_000.0), np.ones(20_000)])
    a = Reservoir(500, 2, seed=3)
    a.update(x)
    b = Reservoir(500, 2, seed=3)
    for i in range(0, 20_000, 313):
        b.update(x[i:i + 313])
    assert a == b
    c = Reservoir.from_dict(json.loads(json.dumps(a.to_dict())))
    a.update(x[:100])
    c.update(x[:100])
    assert a == c


def test_sample_is_uniform():
    counts = np.zeros(10)
    for seed in range(400):
        r = Reservoir(20, 1, seed=seed)
        r.update(np.arange(1000.0)[:, None])
        counts += np.bincount((r.rows[:, 0] // 100).astype(int), minlength=10)
    assert stats.chisquare(counts).pvalue > 0.001


def test_merge_is_uniform_over_the_union():
    rng = np.random.default_rng(0)
    from_a = []
    for seed in range(300):
        a = Reservoir(50, 1, seed=seed)
        a.update(np.zeros((3000, 1)))
        b = Reservoir(50, 1, seed=seed + 1000)
        b.update(np.ones((1000, 1)))
        m = a.merged(b, rng)
        assert m.seen == 4000 and len(m.rows) == 50
        from_a.append((m.rows[:, 0] == 0).mean())
    assert abs(np.mean(from_a) - 0.75) < 0.02


def test_version_1_document_still_loads():
    r = Reservoir(50, 2, seed=7)
    r.update(np.column_stack([np.linspace(0, 1, 80), np.ones(80)]))
    doc = json.loads(json.dumps(r.to_dict()))
    assert doc["version"] == 2 and doc["rows"]["shape"] == [50, 2]
    v1 = {k: v for k, v in doc.items() if k != "rows"}
    v1["version"] = 1
    v1["rows_zlib_b64"] = base64.b64encode(zlib.compress(r.rows.astype("<f8").tobytes())).decode()
    old = Reservoir.from_dict(v1)
    assert old == r
    old.update(np.ones((30, 2)))
    r.update(np.ones((30, 2)))
    assert old == r  # the generator state came back too
