"""T-Cal's levels measured in one pass (:meth:`Atoms.add_levels`, the vectorised tails) against the per-level path.

The per-level path -- :meth:`Atoms.add_level` per level, then :meth:`Atoms.observed`, :meth:`Atoms.variance`,
:meth:`Atoms.third_cumulant` and the scalar :func:`cantelli_pvalue` / :func:`three_moment_pvalue` /
:func:`approx_critical` (T-Cal, Lee et al. 2023: eqs. 5-6 and the exact null moments) -- is written out here
and put in place of :class:`~calmon.algorithms.tcal.adaptive.Levels`' one-pass methods (:func:`_reference_levels`).
Every result of the screens and of the full test must be the same,
float for float (compared as JSON text, which keeps every bit of a float), and so must the levels the Monte
Carlo simulates.
"""

import contextlib
import json
import math

import numpy as np
import pytest

import calmon.algorithms.tcal.adaptive as adaptive
import calmon.algorithms.tcal.atoms as atoms_mod
import calmon.algorithms.tcal.estimators as estimators
from calmon.algorithms.tcal.atoms import Atoms
from calmon.algorithms.tcal.tails import (
    approx_critical,
    approx_criticals,
    cantelli_pvalue,
    cantelli_pvalues,
    chi_params,
    three_moment_pvalue,
    three_moment_pvalues,
)
from calmon.state.buckets import BucketStats
from calmon.stats.grid import ScoreGrid
from calmon.testers import run_tester, screen_tester


def _window(n: int, temperature: float, bins: int, seed: int):
    """A binary window as the agent keeps it: a grid and a reservoir of 256 (complete up to 256 events)."""
    rng = np.random.default_rng(seed)
    p = rng.beta(2, 2, n)
    z = 1 / (1 + np.exp(-(np.log(p) - np.log1p(-p)) / temperature))
    b = BucketStats(2, bins=bins, reservoir=256)
    b.update(z, None, (rng.uniform(size=n) < p).astype(np.int64))
    return b.stats.calibration_data()


def _text(result) -> str | None:
    return None if result is None else json.dumps(result.to_dict(), sort_keys=True)


def _measure_per_level(cls, atoms: Atoms, bins: list[int], *, method: str, alpha: float, combine: str):
    """:meth:`Levels.measure` one level at a time: :meth:`Atoms.add_level`, then the per-level moments."""
    for m in bins:
        atoms.add_level(m)
    obs, plugin = atoms.observed()
    var = np.array([atoms.variance(lev) for lev in atoms.levels])
    k3 = np.array([atoms.third_cumulant(lev) for lev in atoms.levels])
    return cls(atoms=atoms, method=method, alpha=alpha, combine=combine, bins=bins, obs=obs, plugin=plugin,
               var=var, k3=k3)


def _tails_per_level(self) -> None:
    """``Levels.__post_init__`` by the scalar tail functions."""
    self.cant = np.array([cantelli_pvalue(t, v) for t, v in zip(self.obs, self.var)])
    self.approx = np.array([three_moment_pvalue(t, v, k) for t, v, k in zip(self.obs, self.var, self.k3)])


def _critical_per_level(self) -> list[float | None]:
    return [approx_critical(v, k, self.level_alpha) for v, k in zip(self.var, self.k3)]


@contextlib.contextmanager
def _reference_levels():
    """The per-level reference path in place of :class:`Levels`' one-pass methods; yields the levels measured."""
    measured: list[Atoms] = []

    def measure(cls, atoms: Atoms, bins: list[int], **kw):
        measured.append(atoms)
        return _measure_per_level(cls, atoms, bins, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(adaptive.Levels, "measure", classmethod(measure))
        mp.setattr(adaptive.Levels, "__post_init__", _tails_per_level)
        mp.setattr(adaptive.Levels, "critical", _critical_per_level)
        yield measured


def _both(fn):
    """``fn()`` on the one-pass path, then on the per-level reference path."""
    fast = fn()
    with _reference_levels() as measured:
        ref = fn()
    assert measured, "the reference path was not taken"
    return fast, ref


def _level_fields(atoms: Atoms) -> list[list[np.ndarray]]:
    return [[lev.starts_all, lev.keep, lev.N, lev.Z, lev.ZZ, lev.V, lev.W, lev.P3, lev.M1, lev.M2]
            for lev in atoms.levels]


def _assert_same_levels(a: Atoms, b: Atoms) -> None:
    fa, fb = _level_fields(a), _level_fields(b)
    assert len(fa) == len(fb)
    for la, lb in zip(fa, fb):
        for x, y in zip(la, lb):
            assert x.dtype == y.dtype and np.array_equal(x, y), (x, y)
            if x.dtype.kind == "f":  # bit for bit (signed zeros too)
                assert np.array_equal(np.signbit(x), np.signbit(y))


def test_screens_and_full_test_give_the_per_level_results_bit_for_bit():
    rng = np.random.default_rng(20261123)
    opened = screened = 0
    for i in range(220):
        n = int(round(math.exp(rng.uniform(math.log(50), math.log(20_000)))))
        data = _window(n, float(rng.uniform(0.8, 1.2)), int(rng.choice([256, 1024])), seed=i)
        fast, ref = _both(lambda: _text(screen_tester("tcal", data, mc=200, seed=i)))
        assert fast == ref, (i, n)
        opened += fast is None
        screened += fast is not None
        if fast is None or i % 10 == 0:  # the simulation starts from the same levels
            fast, ref = _both(lambda: _text(run_tester("tcal", data, mc=200, seed=i)))
            assert fast == ref, (i, n)
    assert opened >= 10 and screened >= 100  # both answers exercised


@pytest.mark.parametrize("exact_events", [atoms_mod._EXACT_EVENTS, 0])
@pytest.mark.parametrize("tile", [estimators._TILE_ELEMENTS, 500])
def test_add_levels_equals_add_level_then_observed_variance_third_cumulant(monkeypatch, exact_events, tile):
    """Grid (cumulative fixed-point sums, or reduceat when too large) and raw atoms, dyadic and other bins,
    the tiled pass split into groups of levels."""
    monkeypatch.setattr(atoms_mod, "_EXACT_EVENTS", exact_events)
    monkeypatch.setattr(estimators, "_TILE_ELEMENTS", tile)
    rng = np.random.default_rng(7)
    for trial in range(40):
        n = int(rng.integers(3, 5000))
        z = rng.beta(0.5, 0.5, n) if trial % 3 else np.round(rng.uniform(size=n), 2)  # ties: atoms of many
        z[: trial % 4] = [0.0, 1.0, 0.5][: trial % 4]
        y = (rng.uniform(size=n) < z).astype(float)
        g = ScoreGrid(bins=[256, 1024, 4096][trial % 3])
        g.update(z, y)
        cases = [(Atoms.from_grid, g, [2**b for b in range(1, int(math.log2(g.bins)) + 1)]),
                 (Atoms.from_grid, g, [g.bins, 8, 2]),
                 (lambda d: Atoms.from_raw(*d), (z, y), [2**b for b in range(1, 15)]),
                 (lambda d: Atoms.from_raw(*d), (z, y), [3, 10, 100, 7, 1])]
        for make, src, bins in cases:
            a, b = make(src), make(src)
            got = a.add_levels(bins)
            for m in bins:
                b.add_level(m)
            dpe, plug = b.observed()
            want = (dpe, plug, np.array([b.variance(lev) for lev in b.levels]),
                    np.array([b.third_cumulant(lev) for lev in b.levels]))
            for x, w in zip(got, want):
                assert x.tobytes() == w.tobytes(), (trial, bins, x, w)
            _assert_same_levels(a, b)


def test_trailing_levels_of_single_atoms_are_the_atoms():
    """A sparse fine grid: its 8 finest levels hold one atom per cell (copied, not summed)."""
    z = np.linspace(0.01, 0.99, 20)
    g = ScoreGrid(bins=4096)
    g.update(z, (z > 0.5) * 1.0)
    bins = [2**b for b in range(1, 13)]
    a, b = Atoms.from_grid(g), Atoms.from_grid(g)
    got = a.add_levels(bins)
    assert [lev.starts_all.size for lev in a.levels][-8:] == [20] * 8
    for m in bins:
        b.add_level(m)
    want = (*b.observed(), np.array([b.variance(lev) for lev in b.levels]),
            np.array([b.third_cumulant(lev) for lev in b.levels]))
    assert all(x.tobytes() == w.tobytes() for x, w in zip(got, want))
    _assert_same_levels(a, b)


def test_levels_added_one_by_one_after_a_pass_keep_their_order():
    z = np.random.default_rng(1).uniform(size=400)
    a, b = Atoms.from_raw(z, np.zeros(400)), Atoms.from_raw(z, np.zeros(400))
    a.add_levels([2, 8])
    a.add_level(32)
    for m in (2, 8, 32):
        b.add_level(m)
    _assert_same_levels(a, b)
    assert [lev.bins for lev in a.levels] == [2, 8, 32]


def test_grid_levels_must_divide_the_grid():
    g = ScoreGrid(bins=64)
    g.update(np.array([0.1, 0.7]), np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="does not divide"):
        Atoms.from_grid(g).add_levels([2, 3])


def test_vectorised_tails_equal_the_scalar_functions():
    rng = np.random.default_rng(3)
    k = 4000
    t = rng.standard_normal(k) * 10.0 ** rng.integers(-12, 0, k)
    v = np.abs(rng.standard_normal(k)) * 10.0 ** rng.integers(-20, -2, k)
    k3 = rng.standard_normal(k) * 10.0 ** rng.integers(-30, -4, k)
    t[:6], v[:6], k3[:6] = [0.0, -0.0, 1e-3, np.nan, 1e-3, -1e-3], [0.0, 1e-6, 0.0, 1e-6, np.nan, 1e-6], \
        [0.0, 1e-9, 1e-9, 1e-9, 1e-9, np.nan]
    v[6:12] = 0.0
    k3[12:20] = 0.0
    want = np.array([cantelli_pvalue(a, b) for a, b in zip(t, v)])
    assert cantelli_pvalues(t, v).tobytes() == want.tobytes()
    want = np.array([three_moment_pvalue(a, b, c) for a, b, c in zip(t, v, k3)])
    assert three_moment_pvalues(t, v, k3).tobytes() == want.tobytes()
    pos = (v > 0) & (k3 > 0)  # the levels' usual case, parameters computed once and shared
    chi = chi_params(v[pos], k3[pos])
    assert three_moment_pvalues(t[pos], v[pos], k3[pos], chi).tobytes() == want[pos].tobytes()
    for level in (0.05, 0.005):
        want_c = [approx_critical(b, c, level) for b, c in zip(v, k3)]
        got_c = approx_criticals(v, k3, level)
        assert [None if x is None else x.hex() for x in got_c] == [None if x is None else x.hex() for x in want_c]
        got_pos = approx_criticals(v[pos], k3[pos], level, chi)
        assert [x.hex() for x in got_pos] == [x.hex() for x, ok in zip(want_c, pos) if ok]  # type: ignore[union-attr]
