"""U-restricted lower distance to calibration as a small L1 problem on cumulative distributions.

The LP of Lemma 16 (Hu, Tian, Yang 2024) couples every (v, y) pair with every grid point ``u``: ``2 |V| |U|``
variables (51,712 for 256 cells and 101 grid points, ~1.3 s in HiGHS).  Its only coupling between the
outcomes is the calibration row of each ``u``.  Write ``t_u >= 0`` for the mass sent to ``u``; calibration
forces ``P_u = u t_u`` of it to be positives and ``Q_u = (1 - u) t_u`` negatives.  For fixed ``t`` the rest
splits into two one-dimensional transport problems with cost ``|u - v|`` -- positives ``D(., 1) -> P`` and
negatives ``D(., 0) -> Q`` -- whose optimal cost is the area between the cumulative distribution functions
(W1 on the line: ``W1(mu, nu) = int |F_mu(x) - F_nu(x)| dx``, Vallender 1973).  Hence, exactly,

    dCE^U = min_{t >= 0, sum u t_u = D(1), sum (1 - u) t_u = D(0)}
            sum_k dx_k ( |F_1(x_k) - sum_{u <= x_k} u t_u| + |F_0(x_k) - sum_{u <= x_k} (1 - u) t_u| )

over the intervals ``[x_k, x_{k+1})`` between consecutive points of ``V`` union ``U`` (``F_1``, ``F_0``: the
cumulative positive and negative masses).  As an LP (each absolute value split into two non-negative parts):
``|U| + 4K`` variables and ``2K + 2`` rows, ``K <= |V| + |U|`` -- 1,500 variables instead of 51,712 for
256 x 101, and 150 instead of 544 for the p-value's 16 x 17.  The matrix depends only on ``V`` and ``U``,
so :class:`CdfLP` builds it once and each replicate of a null simulation changes only the right-hand side.

References
----------
Hu, Tian, Yang. Testing Calibration in Subquadratic Time (2024): Definition 7 (U-LDTC), Lemma 16 (the LP).
Vallender. Calculation of the Wasserstein distance between probability distributions on the line.
Theory Probab. Appl. 18, 784-786 (1973).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

try:  # scipy >= 1.15 ships HiGHS' own Python class: a model kept between solves restarts from its last basis
    from scipy.optimize._highspy import _core as _hc
except ImportError:  # pragma: no cover - older scipy: every solve through linprog (same values, slower)
    _hc = None

__all__ = ["CdfLP", "ldtc_cdf", "shared_lp"]

#: CdfLP models kept per process (:func:`shared_lp`): the tester grids (256 cells x 101-401 points) and the
#: p-value's coarse cells, whose positions are cell means and so differ per window.
_SHARED_MAX = 64
_shared: OrderedDict[tuple[bytes, bytes], CdfLP] = OrderedDict()
_shared_lock = threading.Lock()
#: Decimals an LP value is rounded to (see :meth:`CdfLP._solve_rhs`).
_DECIMALS = 12


def shared_lp(v: np.ndarray, u: np.ndarray) -> CdfLP:
    """The process's :class:`CdfLP` for points ``v`` and grid ``u`` (built once, least recently used dropped).

    Windows binned on the same grid share one model, so each solve restarts the dual simplex from the
    previous window's optimal basis -- still dual feasible, since only the right-hand side differs -- and
    takes a few pivots instead of a solve from scratch.  The value does not depend on the start.
    """
    v = np.ascontiguousarray(v, dtype=np.float64)
    u = np.ascontiguousarray(u, dtype=np.float64)
    key = (v.tobytes(), u.tobytes())
    with _shared_lock:
        lp = _shared.get(key)
        if lp is not None:
            _shared.move_to_end(key)
            return lp
    lp = CdfLP(v, u)
    with _shared_lock:
        _shared[key] = lp
        while len(_shared) > _SHARED_MAX:
            _shared.popitem(last=False)
    return lp


class CdfLP:
    """The CDF form of Lemma 16's LP for fixed points ``v`` and grid ``u`` (module docstring).

    Parameters
    ----------
    v
        Scores in [0, 1] (the cells' representatives; ties allowed).
    u
        Grid of calibrated predictions, sorted, containing 0 and 1.

    Examples
    --------
    >>> lp = CdfLP(np.array([0.3]), np.linspace(0, 1, 11))
    >>> round(lp.solve(np.array([6.0]), np.array([4.0])), 6)   # one score 0.3 with 60 % positives
    0.3
    >>> round(lp.solve(np.array([3.0]), np.array([7.0])), 6)   # calibrated
    0.0
    """

    def __init__(self, v: Any, u: Any) -> None:
        self.v = np.asarray(v, dtype=np.float64).ravel()
        self.u = np.asarray(u, dtype=np.float64).ravel()
        u = self.u
        if u.size < 2 or u[0] != 0.0 or u[-1] != 1.0 or np.any(np.diff(u) <= 0):
            raise ValueError("the u-grid must be increasing and contain both 0 and 1")
        if self.v.size == 0 or not (np.all(np.isfinite(self.v)) and self.v.min() >= 0.0 and self.v.max() <= 1.0):
            raise ValueError("scores must be non-empty, finite and lie in [0, 1]")
        x = np.union1d(self.v, u)  # breakpoints; the last is 1, where both CDFs are complete
        self.x = x[:-1]
        dx = np.diff(x)
        k, m = self.x.size, u.size
        self.k, self.m = k, m
        # F_y(x_k) = sum of masses at v <= x_k: the cell index of every v among the breakpoints
        self.v_at = np.searchsorted(self.x, self.v, side="left")
        # row k of the cumulative map: grid points u_j <= x_k
        below = u[None, :] <= self.x[:, None]  # (k, m)
        rr, jj = np.nonzero(below)
        # columns: t (m), then e+ e- (positives) and f+ f- (negatives), k each
        eye = np.arange(k)
        rows = np.concatenate([rr, eye, eye, k + rr, k + eye, k + eye, np.full(m, 2 * k), np.full(m, 2 * k + 1)])
        cols = np.concatenate([jj, m + eye, m + k + eye, jj, m + 2 * k + eye, m + 3 * k + eye, np.arange(m),
                               np.arange(m)])
        vals = np.concatenate([u[jj], -np.ones(k), np.ones(k), 1.0 - u[jj], -np.ones(k), np.ones(k), u, 1.0 - u])
        self.a_eq = sparse.csr_matrix((vals, (rows, cols)), shape=(2 * k + 2, m + 4 * k))
        self.cost = np.concatenate([np.zeros(m), dx, dx, dx, dx])
        self._highs: Any = None  # the HiGHS model, built at the first solve
        self._lock = threading.Lock()  # one solve at a time on the kept model (thread pools share it)
        # point -> breakpoint indicator (a score at 1 maps to no column)
        self._to_bp = np.zeros((self.v.size, k))
        inside = self.v_at < k
        self._to_bp[np.nonzero(inside)[0], self.v_at[inside]] = 1.0

    def _rhs(self, w1: np.ndarray, w0: np.ndarray) -> np.ndarray:
        """Right-hand sides for masses ``w1``/``w0`` (rows over the points, each row summing to 1 together)."""
        f1 = np.cumsum(self._per_breakpoint(w1), axis=1)
        f0 = np.cumsum(self._per_breakpoint(w0), axis=1)
        # row k reads S_k - (e+_k - e-_k) = F_1(x_k): e+ - e- = S_k - F_1(x_k), and likewise for the negatives
        return np.concatenate([f1, f0, w1.sum(axis=1, keepdims=True), w0.sum(axis=1, keepdims=True)], axis=1)

    def _masses(self, n1: Any, n0: Any) -> tuple[np.ndarray, np.ndarray]:
        n1 = np.atleast_2d(np.asarray(n1, dtype=np.float64))
        n0 = np.atleast_2d(np.asarray(n0, dtype=np.float64))
        if n1.shape != n0.shape or n1.shape[1] != self.v.size:
            raise ValueError(f"need rows of {self.v.size} counts, got {n1.shape} and {n0.shape}")
        total = n1.sum(axis=1) + n0.sum(axis=1)
        if not np.all(np.isfinite(total)) or np.any(total <= 0) or np.any(n1 < 0) or np.any(n0 < 0):
            raise ValueError("outcome counts must be non-negative, finite and not all zero")
        return n1 / total[:, None], n0 / total[:, None]

    def solve_full(self, n1: Any, n0: Any) -> tuple[float, np.ndarray]:
        """dCE^U and the optimal grid masses ``t_u`` for ``n1`` positives and ``n0`` negatives at the points."""
        w1, w0 = self._masses(np.ravel(n1), np.ravel(n0))
        return self._solve_rhs(self._rhs(w1, w0)[0])

    def solve(self, n1: Any, n0: Any) -> float:
        """dCE^U of ``n1`` positives and ``n0`` negatives at the points."""
        return self.solve_full(n1, n0)[0]

    def solve_many(self, n1: Any, n0: Any) -> np.ndarray:
        """dCE^U of every row of ``n1``/``n0`` (shape ``(r, points)``): one warm-started re-solve per row."""
        w1, w0 = self._masses(n1, n0)
        return np.array([self._solve_rhs(b)[0] for b in self._rhs(w1, w0)])

    def _solve_rhs(self, b_eq: np.ndarray) -> tuple[float, np.ndarray]:
        """Value and ``t`` at right-hand side ``b_eq``: HiGHS from the last basis, else scipy's linprog.

        The value is rounded to 12 decimals: the last bits of an optimum depend on the basis the simplex
        started from (so on the windows solved before in this process), and a tester's result must be a
        function of its data and seed.
        """
        got = None
        if _hc is not None:
            with self._lock:
                got = self._warm(b_eq)
        if got is None:
            res = linprog(self.cost, A_eq=self.a_eq, b_eq=b_eq, bounds=(0.0, None), method="highs")
            if res.status != 0:
                raise RuntimeError(f"HiGHS failed on the LDTC LP (CDF form): {res.message}")
            got = float(res.fun), np.asarray(res.x[: self.m])
        return max(0.0, round(got[0], _DECIMALS)), got[1]

    def _warm(self, b_eq: np.ndarray) -> tuple[float, np.ndarray] | None:
        """The kept HiGHS model re-solved at ``b_eq`` (``None`` if it does not end optimal: linprog decides)."""
        if self._highs is None:
            self._highs = _highs_model(self.a_eq, self.cost)
        h = self._highs
        for i, bi in enumerate(b_eq.tolist()):
            h.changeRowBounds(i, bi, bi)
        h.run()
        if h.getModelStatus() != _hc.HighsModelStatus.kOptimal:
            self._highs = None  # start the next solve from scratch
            return None
        return float(h.getInfo().objective_function_value), np.asarray(h.getSolution().col_value[: self.m])

    def _per_breakpoint(self, w: np.ndarray) -> np.ndarray:
        """Masses ``w`` (rows over the points) summed per breakpoint (a score at 1 falls beyond the last)."""
        return np.asarray(w @ self._to_bp)


def _highs_model(a_eq: sparse.csr_matrix, cost: np.ndarray) -> Any:
    """A quiet HiGHS model of ``min cost x, a_eq x = 0, x >= 0`` (presolve off: it would hide the basis)."""
    a = a_eq.tocsc()
    lp = _hc.HighsLp()
    lp.num_col_, lp.num_row_ = a.shape[1], a.shape[0]
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(a.shape[1])
    lp.col_upper_ = np.full(a.shape[1], _hc.kHighsInf)
    lp.row_lower_ = lp.row_upper_ = np.zeros(a.shape[0])
    lp.a_matrix_.format_ = _hc.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = a.shape[1], a.shape[0]
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    h = _hc._Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("presolve", "off")
    h.setOptionValue("threads", 1)
    h.passModel(lp)
    return h


def ldtc_cdf(v: Any, n1: Any, n0: Any, u: Any) -> dict[str, Any]:
    """dCE^U of weighted points by the CDF form (the value of :func:`~calmon.algorithms.ldtc.ldtc_lp`).

    Parameters
    ----------
    v
        Scores in [0, 1].
    n1, n0
        Positives and negatives (counts or masses) at each score.
    u
        Grid of calibrated predictions containing 0 and 1.

    Returns
    -------
    dict
        ``value``, ``grid_error`` (largest gap of ``u``), ``u`` and ``mass_u`` (the optimal ``t_u``; the
        positives' share of the mass at ``u`` is ``u`` by construction, so ``mean_y_u`` is ``u`` where
        ``mass_u > 0``).

    Examples
    --------
    >>> round(ldtc_cdf([0.2, 0.8], [2, 8], [8, 2], np.linspace(0, 1, 101))["value"], 6)   # calibrated
    0.0
    """
    u = np.unique(np.asarray(u, dtype=np.float64).ravel())
    lp = shared_lp(np.asarray(v, dtype=np.float64).ravel(), u)
    value, t = lp.solve_full(n1, n0)
    with np.errstate(invalid="ignore"):
        mean_y = np.where(t > 1e-12, u, np.nan)
    return {"value": value, "grid_error": float(np.max(np.diff(u))), "u": u, "mass_u": t, "mean_y_u": mean_y}
