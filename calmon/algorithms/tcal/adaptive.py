"""Adaptive T-Cal (Algorithm 2): observed debiased l2-ECE at every scale and one critical-value method.

:func:`tcal_test` measures the levels once (:class:`Levels`) and hands them to one function per
critical-value method (:data:`CRITICAL_VALUES`); the exact Cantelli screen and the approximate
accept screen may answer first.  See :mod:`calmon.algorithms.tcal` for the methods and the
curtailed Monte Carlo.

References
----------
Lee, Huang, Hassani, Dobriban. T-Cal (JMLR 2023): eqs. (6)-(7), Algorithms 1-2, Theorems 3 and 5,
Appendix C.3.  Besag, Clifford. Sequential Monte Carlo p-values. Biometrika 78 (1991).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calmon.algorithms.tcal.atoms import BATCH_ELEMENTS, Atoms
from calmon.algorithms.tcal.estimators import check_binary, check_bins, check_grid, n_levels, theorem3_threshold
from calmon.algorithms.tcal.tails import (
    approx_criticals,
    cantelli_pvalues,
    chi_params,
    finite_or_none,
    kth_largest,
    q_params,
    q_transform,
    three_moment_pvalues,
)
from calmon.stats.grid import ScoreGrid

__all__ = ["METHODS", "COMBINES", "CRITICAL_VALUES", "Levels", "SimulationNeeded", "tcal_test",
           "insufficient_result"]

METHODS = ("auto", "mc-raw", "mc-grid", "cantelli", "theorem3", "moment3", "binomial")
COMBINES = ("bonferroni", "minp")
#: Relative tolerance (in null standard deviations) counting near-ties as exceedances (conservative).
_TIE_TOL = 1e-7
#: Methods that bound or approximate the null law instead of simulating it.
_ANALYTIC = ("cantelli", "theorem3", "moment3")


# ----------------------------------------------------------------------------------------------------------
# the levels: what every critical-value method starts from
# ----------------------------------------------------------------------------------------------------------
@dataclass
class Levels:
    """Observed DPE, plug-in and exact null moments at every tested scale.

    Attributes
    ----------
    atoms
        The Monte Carlo engine with one level per entry of ``bins``.
    method, alpha, combine
        The requested critical-value method, level and combination of levels.
    bins
        Number of bins of each level.
    obs, plugin
        Observed DPE and plug-in estimate per level (scalar convention).
    var, k3
        Exact null variance and third cumulant per level.
    cant, approx
        Cantelli bound and three-moment approximation of each level's p-value.

    Examples
    --------
    >>> rng = np.random.default_rng(0); z = rng.uniform(size=500); y = (rng.uniform(size=500) < z) * 1.0
    >>> lv = Levels.measure(Atoms.from_raw(z, y), [2, 4], method="cantelli", alpha=0.05, combine="bonferroni")
    >>> lv.count, lv.level_alpha
    (2, 0.025)
    >>> out = CRITICAL_VALUES["cantelli"](lv, SimulationOptions(mc=1, rng=rng))
    >>> out.fields["method"], len(out.p_values), out.adjusted <= 1.0
    ('cantelli', 2, True)
    """

    atoms: Atoms
    method: str
    alpha: float
    combine: str
    bins: list[int]
    obs: np.ndarray
    plugin: np.ndarray
    var: np.ndarray
    k3: np.ndarray
    cant: np.ndarray = field(init=False)
    approx: np.ndarray = field(init=False)
    #: Chi-square parameters of every level's three-moment tail (``None`` unless all ``var``, ``k3`` > 0).
    chi: tuple[np.ndarray, np.ndarray] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.cant = cantelli_pvalues(self.obs, self.var)
        if (self.var > 0).all() and (self.k3 > 0).all():
            self.chi = chi_params(self.var, self.k3)
        self.approx = three_moment_pvalues(self.obs, self.var, self.k3, self.chi)

    @classmethod
    def measure(cls, atoms: Atoms, bins: list[int], *, method: str, alpha: float, combine: str) -> Levels:
        """Add every level to ``atoms`` and compute its statistics (eqs. 5-6) and exact null moments."""
        obs, plugin, var, k3 = atoms.add_levels(bins)
        return cls(atoms=atoms, method=method, alpha=alpha, combine=combine, bins=bins, obs=obs, plugin=plugin,
                   var=var, k3=k3)

    @property
    def count(self) -> int:
        return len(self.bins)

    @property
    def sd(self) -> np.ndarray:
        return np.sqrt(self.var)

    @property
    def level_alpha(self) -> float:
        """Per-level level: ``alpha / L`` under Bonferroni, ``alpha`` for the min-p combination."""
        return self.alpha / self.count if self.combine == "bonferroni" else self.alpha

    def critical(self) -> list[float | None]:
        """Three-moment critical value of every level at its level (``None``: no variance)."""
        return approx_criticals(self.var, self.k3, self.level_alpha, self.chi)

    def describe(self, b_eq7: int, dyadic: bool) -> dict[str, Any]:
        """The result fields every method shares (key order of the JSON document)."""
        out: dict[str, Any] = {
            "alpha": self.alpha, "n": self.atoms.n, "B_eq7": b_eq7, "bins": self.bins,
            "levels": [m.bit_length() - 1 if m & (m - 1) == 0 else None for m in self.bins],
            "levels_capped": bool(dyadic and self.count < b_eq7),
            "statistics": self.obs.tolist(), "null_sd": self.sd.tolist(),
            "cantelli_p_values": self.cant.tolist(), "approx_p_values": self.approx.tolist(),
            "combine": self.combine, "screen": None,
            "convention": "scalar (one-hot K=2 value is 2x)",
        }
        out["plugin"] = self.plugin.tolist()
        return out


@dataclass
class Outcome:
    """What a critical-value method decides: per-level p-values and critical values, the adjusted p-value."""

    p_values: np.ndarray
    critical: list[float | None]
    adjusted: float
    fields: dict[str, Any]


@dataclass(frozen=True)
class SimulationOptions:
    """Monte Carlo settings of :func:`tcal_test` (used by the ``mc-*`` methods only)."""

    mc: int
    rng: np.random.Generator
    min_resolution: bool = True
    curtail: bool = True


# ----------------------------------------------------------------------------------------------------------
# one function per critical-value method
# ----------------------------------------------------------------------------------------------------------
def _bonferroni(p_values: np.ndarray, levels: int) -> float:
    return float(min(1.0, levels * p_values.min()))


def by_cantelli(lv: Levels, opts: SimulationOptions) -> Outcome:
    """Exact one-sided Chebyshev (Cantelli) bound per level: valid and conservative, no simulation."""
    return _cantelli(lv, screened_from=None)


def _cantelli(lv: Levels, screened_from: str | None) -> Outcome:
    a_b = lv.level_alpha
    crit: list[float | None] = [float(s * math.sqrt((1 - a_b) / a_b)) for s in lv.sd]
    fields = {"method": "cantelli", "screened_from": screened_from, "mc_requested": 0, "mc_draws": 0,
              "screen": None if screened_from is None else "cantelli-reject"}
    return Outcome(lv.cant, crit, _bonferroni(lv.cant, lv.count), fields)


def by_moment3(lv: Levels, opts: SimulationOptions) -> Outcome:
    """Pearson's three-moment chi-square approximation (not exact; no simulation)."""
    crit = lv.critical()
    fields = {"method": "moment3", "mc_requested": 0, "mc_draws": 0, "exact": False}
    return Outcome(lv.approx, crit, _bonferroni(lv.approx, lv.count), fields)


def by_theorem3(lv: Levels, opts: SimulationOptions) -> Outcome:
    """Closed-form threshold of Theorem 3 turned into a p-value (one-hot units, K = 2)."""
    n = lv.atoms.n
    c = np.array([min(m**0.5 / n, m**-0.5) for m in lv.bins])
    t1 = 2.0 * lv.obs  # one-hot units, K = 2
    pv = np.where(t1 > 0, np.minimum(1.0, 8.0 * c**2 / np.where(t1 > 0, t1, 1.0) ** 2), 1.0)
    crit: list[float | None] = [theorem3_threshold(n, m, lv.level_alpha) for m in lv.bins]
    fields = {"method": "theorem3", "mc_requested": 0, "mc_draws": 0}
    return Outcome(pv, crit, _bonferroni(pv, lv.count), fields)


def _accept_screen(lv: Levels) -> Outcome:
    """Every level far from rejection by the three-moment approximation: accept without simulating."""
    pv = lv.approx
    crit = lv.critical()
    adj = _bonferroni(pv, lv.count) if lv.combine == "bonferroni" else float(pv.min())
    fields = {"method": lv.method, "screen": "approx-accept", "mc_requested": 0, "mc_draws": 0, "exact": False}
    return Outcome(pv, crit, adj, fields)


def screened(lv: Levels, screen: bool, accept_margin: float | None) -> Outcome | None:
    """The answer of a screen of a Monte Carlo method, or ``None`` when the simulation must run."""
    if not (screen and lv.method.startswith("mc")):
        return None
    if lv.count * lv.cant.min() <= lv.alpha:
        return _cantelli(lv, screened_from=lv.method)
    if accept_margin and lv.approx.min() >= accept_margin * lv.level_alpha:
        return _accept_screen(lv)
    return None


# ----------------------------------------------------------------------------------------------------------
# the curtailed Monte Carlo
# ----------------------------------------------------------------------------------------------------------
@dataclass
class _Simulation:
    """Running state: exceedances per level (and of the min-p statistic ``M``) and where each reached ``h``."""

    h: int  # exceedances after which a level can no longer reject
    exceed: np.ndarray
    stop_at: np.ndarray  # draw index of the h-th exceedance (0: not reached)
    minp: bool
    exceed_m: int = 0
    stop_m: int = 0
    done: int = 0
    draws: list[np.ndarray] = field(default_factory=list)

    def record(self, T: np.ndarray, threshold: np.ndarray, below_m: np.ndarray | None) -> None:
        """Count a batch of draws ``T`` (rows: draws) against the observed ``threshold``."""
        self.draws.append(T)
        cum = np.cumsum(T >= threshold, axis=0) + self.exceed
        for j in np.flatnonzero((self.stop_at == 0) & (cum[-1] >= self.h)):
            self.stop_at[j] = self.done + 1 + int(np.argmax(cum[:, j] >= self.h))
        self.exceed = cum[-1]
        if below_m is not None:
            cm = np.cumsum(below_m) + self.exceed_m
            if self.stop_m == 0 and cm[-1] >= self.h:
                self.stop_m = self.done + 1 + int(np.argmax(cm >= self.h))
            self.exceed_m = int(cm[-1])
        self.done += T.shape[0]

    def hopeless(self) -> bool:
        """No level (min-p: the combined statistic) can reject any more."""
        return self.stop_m > 0 if self.minp else bool(np.all(self.stop_at > 0))

    def next_batch(self) -> int:
        """Enough draws for the slowest pending statistic at its observed exceedance rate."""
        pending = np.array([self.exceed_m]) if self.minp else self.exceed[self.stop_at == 0]
        if pending.size == 0 or (self.minp and self.stop_m > 0):
            return 4 * self.done
        rate = np.maximum(pending, 1) / self.done
        return int(min(max(32, 1.2 * np.max((self.h - pending) / rate)), 4 * self.done))


def _simulate(lv: Levels, draws: int, opts: SimulationOptions, m_obs: float,
              qpar: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> _Simulation:
    """Null draws in growing batches until ``draws`` are done or (``curtail``) the answer is settled."""
    minp = lv.combine == "minp"
    sim = _Simulation(h=math.floor(lv.level_alpha * (draws + 1)) + 1, exceed=np.zeros(lv.count, dtype=np.int64),
                      stop_at=np.zeros(lv.count, dtype=np.int64), minp=minp)
    threshold = lv.obs - _TIE_TOL * lv.sd
    batch = 64
    cap = max(1, BATCH_ELEMENTS // max(1, lv.atoms.N.size))
    simulator = lv.atoms.simulator(min(cap, draws))  # = stats(*draw(..)) bit for bit; buffers reused
    while sim.done < draws:
        T = simulator(min(batch, cap, draws - sim.done), opts.rng)
        sim.record(T, threshold, q_transform(T, qpar).min(axis=1) <= m_obs * (1 + 1e-9) if minp else None)
        if opts.curtail and sim.hopeless():
            break
        batch = sim.next_batch()
    simulator.release()
    return sim


def by_monte_carlo(lv: Levels, opts: SimulationOptions) -> Outcome:
    """Y-only Monte Carlo (raw atoms: exact; grid cells: approximate), curtailed, Bonferroni or min-p."""
    L = lv.count
    minp = lv.combine == "minp"
    R = int(opts.mc)
    if opts.min_resolution:
        R = max(R, math.ceil(20 * (1 if minp else L) / lv.alpha))
    # max-type combination: M = min_b q_b(T_b) with q_b the (fixed, continuous) three-moment tail of
    # level b; its Monte Carlo rank p-value is exact by exchangeability and has no ties
    qpar = q_params(lv.var, lv.k3)
    m_obs = float(q_transform(lv.obs[None, :], qpar).min()) if minp else 0.0
    sim = _simulate(lv, R, opts, m_obs, qpar)
    done = sim.done
    full = (1.0 + sim.exceed) / (R + 1.0)
    if minp:
        pv = (1.0 + sim.exceed) / (done + 1.0)  # per-level Monte Carlo p-values (informative)
        adj = sim.h / sim.stop_m if (done < R and sim.stop_m > 0) else (1.0 + sim.exceed_m) / (R + 1.0)
    else:
        # Besag-Clifford p-value h / L for levels whose simulation was curtailed; rank p-value otherwise
        pv = np.where(sim.stop_at > 0, sim.h / np.maximum(sim.stop_at, 1), full) if done < R else full
        adj = _bonferroni(pv, L)
    t_all = np.vstack(sim.draws)
    kk = math.floor((lv.alpha / L) * (done + 1))
    crit = [kth_largest(t_all[:, j], kk) for j in range(L)]
    fields: dict[str, Any] = {"method": lv.method, "mc_requested": R, "mc_draws": done,
                              "curtailed": bool(done < R), "exact": lv.atoms.exact}
    if minp:
        fields["minp_statistic"] = m_obs
    return Outcome(pv, crit, adj, fields)


#: Critical-value method name -> the function deciding with it.
CRITICAL_VALUES: dict[str, Callable[[Levels, SimulationOptions], Outcome]] = {
    "mc-raw": by_monte_carlo,
    "mc-grid": by_monte_carlo,
    "cantelli": by_cantelli,
    "theorem3": by_theorem3,
    "moment3": by_moment3,
}


# ----------------------------------------------------------------------------------------------------------
# the test
# ----------------------------------------------------------------------------------------------------------
class SimulationNeeded(Exception):
    """``tcal_test(simulate=False)``: no screen decided, the answer needs the Monte Carlo."""


def tcal_test(z: np.ndarray | None = None, y: np.ndarray | None = None, grid: ScoreGrid | None = None, *,
              alpha: float = 0.05, mc: int = 2000, rng: np.random.Generator | int | None = None,
              method: str = "mc-raw", bins: Sequence[int] | None = None, combine: str = "bonferroni",
              screen: bool = True, min_resolution: bool = True, max_level: int | None = None,
              curtail: bool = True, accept_margin: float | None = 2.0, simulate: bool = True) -> dict[str, Any]:
    """Adaptive T-Cal (Algorithm 2) -- or T-Cal at given scales -- from raw samples or a fine grid.

    Parameters
    ----------
    z, y
        Raw scores and 0/1 outcomes (full data or a reservoir sample); used by ``"mc-raw"`` and, when no
        grid is given, by ``"cantelli"``/``"theorem3"``.
    grid
        Fine single-channel :class:`ScoreGrid` (used by ``"mc-grid"``; by ``"cantelli"``/``"theorem3"``
        when ``z`` is not given).
    alpha
        Level of the test.
    mc
        Number ``R`` of Monte Carlo draws (raised to ``ceil(20 L / alpha)`` for ``L`` levels when
        ``min_resolution``).
    rng
        Generator or seed.
    method
        ``"mc-raw"`` (a), ``"mc-grid"`` (b), ``"cantelli"`` or ``"theorem3"`` (c), or ``"moment3"``: the
        three-moment chi-square approximation of :func:`three_moment_pvalue` (exact null variance and third
        cumulant; an approximation, no simulation).
    bins
        Numbers of bins to test; default the dyadic scales ``2, 4, ..., 2**B`` with ``B`` of eq. (7),
        capped at the grid depth (grid data) or at ``max_level``.
    combine
        ``"bonferroni"`` (Algorithm 2: level ``alpha / L`` per scale, adjusted p-value
        ``min(1, L min_b p_b)``) or ``"minp"``: max-type combination, the statistic
        ``M = min_b q_b(T_b)`` (``q_b`` the three-moment tail of level ``b``, a fixed continuous transform)
        with its exact Monte Carlo rank p-value over the joint null of all levels (Monte Carlo methods only).
    screen
        Try the exact Cantelli bound first and skip the simulation when it already rejects.
    min_resolution
        Raise ``R`` to at least ``20 L / alpha`` (so the rank p-value can resolve ``alpha / L``).
    max_level
        Cap on the dyadic exponent for raw data.
    curtail
        Stop simulating once no level can reject any more (Bonferroni only); the decision is the
        one of the full ``R``-draw test on the same stream of draws.
    accept_margin
        With ``screen``, accept without simulating when the three-moment approximation
        (:func:`three_moment_pvalue`) puts every level's p-value above ``accept_margin`` times its level
        (``None`` or 0 disables this approximate screen; the Cantelli screen is exact).  Accepting can
        only lower the rejection rate, so the screen cannot raise the level; 2 (it was 4) lost no
        rejection in 400 replications per setting of ``benchmarks/tcal_screen_power.py``.
    simulate
        ``False``: raise :class:`SimulationNeeded` instead of running the Monte Carlo when no screen
        decides (the agent answers the screened windows at once and sends the rest to its worker pool;
        the same call with ``simulate=True`` then gives the result the test would have given inline).

    Returns
    -------
    JSON-serialisable dict: ``levels`` (exponents ``b`` when dyadic), ``bins``, ``statistics`` (DPE per
    level, scalar convention), ``plugin`` (plug-in per level), ``null_sd``, ``critical_values`` (reject
    level ``b`` when the DPE exceeds it; ``None`` when not resolvable), ``p_values``, ``cantelli_p_values``,
    ``adjusted_p_value`` (= ``p_value``), ``decision``, ``method``, ``combine``, ``statistic`` (DPE at the
    level with the smallest p-value), ``n``, ``B_eq7``, ``mc_requested`` and ``mc_draws``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> z = rng.uniform(size=2000); y = (rng.uniform(size=2000) < z).astype(float)
    >>> r = tcal_test(z, y, alpha=0.05, mc=500, rng=1, bins=[4, 16])
    >>> r["decision"], len(r["p_values"])
    ('calibrated', 2)
    >>> yb = (rng.uniform(size=2000) < np.clip(1.3 * z - 0.15, 0, 1)).astype(float)
    >>> tcal_test(z, yb, rng=1)["decision"]
    'miscalibrated'

    References
    ----------
    T-Cal paper: eqs. (6)-(7), Algorithms 1-2, Theorems 3 and 5, Appendix C.3 (Y-only bootstrap).
    """
    _check_options(alpha, mc, method, combine)
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    found = _atoms_for(method, z, y, grid)
    if isinstance(found, str):
        return insufficient_result(method, alpha, 0, found)
    atoms, depth = found
    b_eq7 = n_levels(atoms.n)
    bins_list = _level_bins(b_eq7, depth, bins, max_level)
    if not bins_list:
        return insufficient_result(method, alpha, atoms.n, "grid has no dyadic level")
    lv = Levels.measure(atoms, bins_list, method=method, alpha=alpha, combine=combine)
    if not np.any(lv.var > 0):
        return insufficient_result(method, alpha, atoms.n, "no bin holds two events with non-degenerate scores")
    result = lv.describe(b_eq7, dyadic=bins is None)
    opts = SimulationOptions(mc=mc, rng=gen, min_resolution=min_resolution, curtail=curtail)
    out = screened(lv, screen, accept_margin)
    if out is None:
        if not simulate and method.startswith("mc"):
            raise SimulationNeeded(f"T-Cal on {atoms.n} events needs its Monte Carlo")
        out = CRITICAL_VALUES[method](lv, opts)
    result.update(out.fields)
    best = int(np.argmin(out.p_values))
    result.update(
        p_values=[float(p) for p in out.p_values], critical_values=[finite_or_none(c) for c in out.critical],
        adjusted_p_value=out.adjusted, p_value=out.adjusted, statistic=float(lv.obs[best]),
        statistic_bins=bins_list[best], decision="miscalibrated" if out.adjusted <= alpha else "calibrated")
    return result


def _check_options(alpha: float, mc: int, method: str, combine: str) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if int(mc) != mc or mc < 1:
        raise ValueError(f"mc must be a positive integer, got {mc!r}")
    if method not in CRITICAL_VALUES:
        raise ValueError(f"method must be one of {METHODS[1:6]}, got {method!r}")
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
    if combine == "minp" and not method.startswith("mc"):
        raise ValueError("combine='minp' needs a Monte Carlo method ('mc-raw' or 'mc-grid')")


def _atoms_for(method: str, z: np.ndarray | None, y: np.ndarray | None,
               grid: ScoreGrid | None) -> tuple[Atoms, int | None] | str:
    """The atoms to simulate and the grid's dyadic depth (``None`` for raw data), or why there are none."""
    if method == "mc-raw" or (method in _ANALYTIC and z is not None):
        if z is None or y is None:
            raise ValueError(f"method {method!r} needs raw scores z and outcomes y")
        z, y = check_binary(z, y)
        if z.size == 0:
            return "no samples"
        return Atoms.from_raw(z, y), None
    if grid is None:
        raise ValueError(f"method {method!r} needs a grid (or raw z, y)")
    check_grid(grid)
    if grid.count == 0:
        return "empty grid"
    return Atoms.from_grid(grid), (grid.bins & -grid.bins).bit_length() - 1  # largest 2**d dividing bins


def _level_bins(b_eq7: int, depth: int | None, bins: Sequence[int] | None, max_level: int | None) -> list[int]:
    """Bins of every tested level: the given ones, or the dyadic scales of eq. (7) capped (may be empty)."""
    if bins is not None:
        out = [check_bins(m) for m in bins]
        if not out:
            raise ValueError("bins must not be empty")
        return out
    top = b_eq7 if depth is None else min(b_eq7, depth)
    if max_level is not None:
        top = min(top, int(max_level))
    return [2**b for b in range(1, top + 1)]


def insufficient_result(method: str, alpha: float, n: int, reason: str) -> dict[str, Any]:
    """The result when no level can be tested (``decision = "insufficient data"``)."""
    return {"statistic": None, "p_value": None, "adjusted_p_value": None, "decision": "insufficient data",
            "method": method, "alpha": alpha, "n": n, "reason": reason, "levels": [], "bins": [],
            "statistics": [], "critical_values": [], "p_values": []}
