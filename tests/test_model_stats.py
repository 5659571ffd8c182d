import json

import numpy as np

from calmon.stats.model import ModelStats


def test_split_updates_merge_to_the_whole_and_round_trip():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), 3000)
    labels = rng.integers(0, 3, 3000)
    whole = ModelStats(classes=3, bins=256, reservoir=0)
    whole.update(probs=probs, labels=labels)
    a = ModelStats(classes=3, bins=256, reservoir=0)
    b = ModelStats(classes=3, bins=256, reservoir=0)
    a.update(probs=probs[:1234], labels=labels[:1234])
    b.update(probs=probs[1234:], labels=labels[1234:])
    assert a + b == whole
    back = ModelStats.from_dict(json.loads(json.dumps(whole.to_dict())))
    assert back == whole and back.count == 3000


def test_memory_is_independent_of_event_count():
    # storage grows with content up to its capacity (sparse grids, reservoir rows as filled), then stays put
    s = ModelStats(reservoir=1000)
    cap = 6 * 8 * (4096 + 15) + 1000 * 2 * 8  # dense fine and ECE grids, a full reservoir
    assert s.nbytes() < cap
    rng = np.random.default_rng(1)
    for _ in range(20):
        z = rng.random(50_000)
        s.update(score=z, labels=(rng.random(50_000) < z).astype(int))
        assert s.nbytes() == cap
    assert s.count == 1_000_000


def test_calibration_data_from_reservoir():
    s = ModelStats(classes=4, reservoir=50)
    rng = np.random.default_rng(2)
    s.update(probs=rng.dirichlet(np.ones(4), 40), labels=rng.integers(0, 4, 40))
    d = s.calibration_data()
    assert d.n == 40 and d.raw_is_complete and d.probs.shape == (40, 4) and d.z.shape == (40,)
    s.update(probs=rng.dirichlet(np.ones(4), 40), labels=rng.integers(0, 4, 40))
    d = s.calibration_data()
    assert d.n == 80 and not d.raw_is_complete and len(d.z) == 50
