"""T-Cal's binomial sampler replays ``Generator.binomial`` bit for bit (calmon/algorithms/tcal/binomial.py)."""

from __future__ import annotations

import numpy as np
import pytest

from calmon.algorithms.tcal.atoms import Atoms
from calmon.algorithms.tcal.binomial import BinomialSampler


@pytest.mark.parametrize("seed", range(40))
def test_draws_equal_numpy_and_leave_the_generator_where_numpy_does(seed: int) -> None:
    g = np.random.default_rng(seed)
    m, r = int(g.integers(1, 200)), int(g.integers(1, 150))
    n = g.integers(1, int(g.choice([3, 10, 40, 120])), m)
    p = g.random(m) ** float(g.choice([1.0, 3.0, 0.3]))
    if seed % 5 == 0:
        p[: m // 3] = 1.0  # drawn as n - Bin(n, 0)
    if seed % 7 == 0:
        p[:1] = 0.0  # numpy consumes no uniform: numpy draws the whole array
    mine, ref = np.random.default_rng(seed + 99), np.random.default_rng(seed + 99)
    got = BinomialSampler.build(n, p).draw(mine, r)
    assert np.array_equal(got, ref.binomial(n, p, size=(r, m)).T)
    assert mine.random() == ref.random()


def test_most_small_atoms_are_replayed_and_large_ones_fall_back_to_numpy() -> None:
    g = np.random.default_rng(1)
    small = BinomialSampler.build(g.integers(2, 12, 500), g.random(500))
    assert small.replayable
    btpe = BinomialSampler.build(np.array([2, 400]), np.array([0.3, 0.5]))  # 400 * 0.5 > 30: BTPE
    assert not btpe.replayable
    mine, ref = np.random.default_rng(5), np.random.default_rng(5)
    assert np.array_equal(btpe.draw(mine, 50), ref.binomial([2, 400], [0.3, 0.5], size=(50, 2)).T)


def test_atom_draws_are_the_numpy_stream() -> None:
    """What T-Cal's Monte Carlo consumed before the sampler: uniforms for singletons, then numpy binomials."""
    g = np.random.default_rng(3)
    z = np.round(g.random(3000), 2)  # repeated scores: atoms of several events next to singletons
    z[:40] = g.random(40)
    atoms = Atoms.from_raw(z, (g.random(3000) < z).astype(float))
    one = atoms.N == 1
    assert one.any() and not one.all()
    rng, ref = np.random.default_rng(11), np.random.default_rng(11)
    for r in (64, 200):
        k, gk = atoms.draw(r, rng)
        u = ref.random((r, int(one.sum())))
        b = ref.binomial(atoms.N[~one].astype(np.int64), atoms.p[~one], size=(r, int((~one).sum())))
        want = np.empty((atoms.N.size, r))
        want[one], want[~one] = (u < atoms.p[one]).T, b.T
        assert np.array_equal(k, want) and np.array_equal(gk, want * (1.0 - 2.0 * atoms.p)[:, None])
