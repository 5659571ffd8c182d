"""T-Cal's Monte Carlo kernel (:class:`calmon.algorithms.tcal.atoms.Simulator`) against direct computations.

The reference below draws with plain ``rng.random`` / ``rng.binomial`` in the stream order T-Cal uses
(per batch: the uniforms of all singleton atoms, draw-major, then numpy's binomials of the other atoms)
and computes each level's DPE from dense cell sums added left to right over the atoms of the cell, as
``sum_c ((S_c^2 - Q_c) / N_c) / n`` (Lee et al. 2023, T-Cal, eq. 3; ``S_c = sum (y - z)``,
``Q_c = sum (y (1 - 2z) + z^2)``).  The kernel must give the same numbers bit for bit.
"""

import numpy as np
import pytest

import calmon.algorithms.tcal.atoms as atoms_mod
from calmon.algorithms.tcal import simulate_null, tcal_test
from calmon.algorithms.tcal.atoms import Atoms
from calmon.stats.grid import ScoreGrid


def _reference_draws(atoms: Atoms, r: int, rng: np.random.Generator) -> np.ndarray:
    """Per-atom positives, shape (atoms, r), in T-Cal's stream order."""
    one = atoms.N == 1
    k = np.empty((atoms.N.size, r))
    if one.any():
        k[one] = (rng.random((r, int(one.sum()))) < atoms.p[one]).T
    if not one.all():
        k[~one] = rng.binomial(atoms.N[~one].astype(np.int64), atoms.p[~one], size=(r, int((~one).sum()))).T
    return k


def _reference_stats(atoms: Atoms, k: np.ndarray) -> np.ndarray:
    """DPE per draw and level from dense per-cell sums added left to right, each level summing what the
    engine's plan says (``Level.source``: the atoms, or the cells of a finer level), cells of N >= 2."""
    atoms.simulator().release()  # makes the plan
    g = k * (1.0 - 2.0 * atoms.p)[:, None]
    out = np.zeros((k.shape[1], len(atoms.levels)))
    full: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for j in sorted(range(len(atoms.levels)), key=lambda j: -atoms.levels[j].starts_all.size):
        lev = atoms.levels[j]
        ends = np.r_[lev.starts_all[1:], atoms.N.size]
        if lev.source < 0:
            rows_k, rows_g, first = k, g, np.arange(atoms.N.size)
        else:
            rows_k, rows_g = full[lev.source]
            first = atoms.levels[lev.source].starts_all  # first atom of each source row
        S = np.zeros((lev.starts_all.size, k.shape[1]))
        Q = np.zeros_like(S)
        for c, (s, e) in enumerate(zip(lev.starts_all, ends)):
            for i in np.flatnonzero((first >= s) & (first < e)):  # left to right, as a sparse row sum
                S[c] += rows_k[i]
                Q[c] += rows_g[i]
        full[j] = (S, Q)
        keep = np.add.reduceat(atoms.N, lev.starts_all) >= 2
        S = S[keep] - lev.Z[:, None]
        Q = Q[keep] + lev.ZZ[:, None]
        S *= S
        S -= Q
        if keep.any():
            out[:, j] = (1.0 / lev.N) @ S / atoms.n
    return out


def _cases():
    rng = np.random.default_rng(5)
    for n in (100, 500, 3000):
        p = rng.beta(2, 2, n)
        y = (rng.random(n) < p) * 1.0
        g = ScoreGrid(1024)
        g.update(p, y)
        yield f"grid{n}", Atoms.from_grid(g)
        yield f"raw{n}", Atoms.from_raw(p, y)
        yield f"ties{n}", Atoms.from_raw(np.round(p, 2), y)  # atoms of several events next to singletons
    g = ScoreGrid(64)
    z = rng.choice([0.0, 0.03, 0.5, 0.97, 1.0], 4000)
    g.update(z, (rng.random(4000) < z) * 1.0)
    yield "coarse-grid", Atoms.from_grid(g)  # no singletons; p = 0 and 1 atoms


@pytest.mark.parametrize("name,atoms", list(_cases()))
def test_kernel_equals_reference_and_draw_stats(name, atoms):
    for m in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        if atoms.fine_bins is None or atoms.fine_bins % m == 0:
            atoms.add_level(m)
    sim = atoms.simulator(300)
    mine, ref, old = (np.random.default_rng(9) for _ in range(3))
    for r in (64, 300, 7, 1000):  # growing past the declared size, and shrinking
        T = sim(r, mine)
        k = _reference_draws(atoms, r, ref)
        assert np.array_equal(T, _reference_stats(atoms, k)), name
        assert np.array_equal(T, atoms.stats(*atoms.draw(r, old))), name
    sim.release()
    assert mine.random() == ref.random() == old.random()  # the same stream consumed


def test_released_arena_is_reused_without_changing_results():
    rng = np.random.default_rng(2)
    z = rng.uniform(size=800)
    a = simulate_null(z, bins=[4, 64, 512], draws=500, rng=3)
    b = simulate_null(z, bins=[4, 64, 512], draws=500, rng=3)  # second run on the first one's arena
    atoms = Atoms.from_raw(z, np.zeros_like(z))
    for m in (4, 64, 512):
        atoms.add_level(m)
    ref = np.random.default_rng(3)
    assert np.array_equal(a, b)
    assert np.array_equal(a, _reference_stats(atoms, _reference_draws(atoms, 500, ref)))


def test_tcal_pvalues_from_the_kernel_equal_reference_ranks():
    """Full raw test, no curtailing: rank p-values from the reference draws equal the reported ones.

    Distinct scores: every atom a singleton, so the stream does not depend on the batch sizes.
    """
    rng = np.random.default_rng(4)
    z = rng.beta(2, 2, 600)
    y = (rng.random(600) < z) * 1.0
    res = tcal_test(z, y, method="mc-raw", bins=[4, 32, 256], mc=400, rng=11, screen=False, curtail=False,
                    min_resolution=False)
    atoms = Atoms.from_raw(z, y)
    for m in (4, 32, 256):
        atoms.add_level(m)
    T = _reference_stats(atoms, _reference_draws(atoms, 400, np.random.default_rng(11)))
    threshold = np.array(res["statistics"]) - 1e-7 * np.array(res["null_sd"])  # adaptive._TIE_TOL
    exceed = (T >= threshold).sum(axis=0)
    assert res["mc_draws"] == 400
    assert np.array_equal(res["p_values"], (1.0 + exceed) / 401.0)


def test_unfolded_weights_path_equals_reference(monkeypatch):
    """Where the CSR kernel fuses multiply-adds, g = k (1 - 2p) is formed and summed: same numbers."""
    monkeypatch.setattr(atoms_mod, "_FOLD", False)
    for name, atoms in list(_cases())[::2]:
        for m in (2, 16, 128, 1024):
            if atoms.fine_bins is None or atoms.fine_bins % m == 0:
                atoms.add_level(m)
        sim, ref = atoms.simulator(200), np.random.default_rng(1)
        T = sim(200, np.random.default_rng(1))
        assert np.array_equal(T, _reference_stats(atoms, _reference_draws(atoms, 200, ref))), name


def _atoms_with_levels(kind: str) -> Atoms:
    rng = np.random.default_rng(5)
    if kind == "raw":
        z = np.round(rng.beta(2, 3, size=700), 2)  # ties: atoms of several events next to singletons
        a = Atoms.from_raw(z, (rng.random(700) < z).astype(float))
        for m in (2, 16, 128, 1024):
            a.add_level(m)
        return a
    g = ScoreGrid(256)
    z = rng.uniform(size=900)
    g.update(z, (rng.random(900) < z).astype(float))
    a = Atoms.from_grid(g)
    for m in (4, 32, 256):
        a.add_level(m)
    return a


@pytest.mark.parametrize("kind", ["raw", "grid"])
@pytest.mark.parametrize("fold", [True, False])
def test_simulator_equals_stats_of_draws(monkeypatch: pytest.MonkeyPatch, kind: str, fold: bool) -> None:
    """Both paths of the kernel, against ``Atoms.stats(*Atoms.draw(r, rng))`` (scipy's ``M @ X`` and a formed
    ``g = k (1 - 2p)``), bit for bit: the weights folded into the matrix, or ``g`` formed (FMA kernels)."""
    if fold and not atoms_mod._FOLD:
        pytest.skip("the CSR kernel fuses multiply-adds here: the folded path is never taken")
    monkeypatch.setattr(atoms_mod, "_FOLD", fold)
    atoms = _atoms_with_levels(kind)
    sim = atoms.simulator(64)
    from_draws = [st.data[: st.indptr[st.rows // 2]] for st in sim.steps if st.source < 0]
    assert from_draws, "no level summed straight from the draws"
    # folded: the k block's entries are ones and the g block's the weights; unfolded: ones in both
    assert all(np.all(d == 1.0) for d in from_draws)
    g_blocks = [st.data[st.indptr[st.rows // 2]:] for st in sim.steps if st.source < 0]
    assert all(np.all(d == 1.0) for d in g_blocks) != fold
    for r, seed in ((64, 1), (17, 2)):
        T = sim(r, np.random.default_rng(seed))
        ref = atoms.stats(*atoms.draw(r, np.random.default_rng(seed)))
        assert np.array_equal(T, ref)
    sim.release()
