"""``calmon.check(df)``: ``calmon check`` on in-memory data, for notebooks.

The data become the :class:`~calmon.offline.dataset.Dataset` a file would (:mod:`calmon.api.frame`), then go
through ``calmon check``'s own code (:func:`calmon.commands.check.report`) with the command's own defaults, so
``check(df).to_dict()`` is the document ``calmon check --json`` prints for the same rows in a file.
"""

from __future__ import annotations

import argparse
import html
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from calmon.api.frame import Column, to_dataset
from calmon.api.join import joined_dataset
from calmon.commands import check as check_command
from calmon.formats.extras import MissingExtra
from calmon.formats.jsonio import clean
from calmon.offline.dataset import Dataset

__all__ = ["CheckResult", "check", "command_args"]


def command_args(module: Any, name: str, **options: Any) -> argparse.Namespace:
    """The namespace ``calmon NAME`` parses from its defaults, with ``options`` (``None``: the default) set.

    The command's parser is the one place its defaults live; an unknown option is a ``TypeError`` as for any call.
    """
    parser = argparse.ArgumentParser(prog="calmon")
    module.register(parser.add_subparsers(dest="command"))
    positional = ["-"] * (2 if name == "apply" else 1)
    args = parser.parse_args([name, *positional])
    for key, value in options.items():
        if not hasattr(args, key):
            raise TypeError(f"{name}() got an unexpected keyword argument {key!r}")
        if value is not None:
            setattr(args, key, value)
    return args


def check(data: Any = None, outcomes: Any = None, *, score: Column = None, label: Column = "label",
          probs: Column = None, id: Column = None, ts: Column = None,  # noqa: A002 -- the event field
          model: str | None = None,
          tests: str | list[str] | None = None, alpha: float | None = None, mc: int | None = None,
          seed: int | None = None, bins: int | None = None, reliability_bins: int | None = None,
          test_params: Mapping[str, Mapping[str, Any]] | None = None, reference: Any = None,
          source: str | None = None) -> CheckResult:
    """Calibration metrics, tests and verdict of labeled predictions: ``calmon check`` on a DataFrame.

    Parameters
    ----------
    data
        A pandas or polars DataFrame, a dict of arrays, a structured array, or ``None`` with arrays below.
    outcomes
        The outcomes in a frame of their own (an id and ``label`` column, optional ``ts``, ``model``): ``data``
        then holds the predictions, and the two are joined by id as ``calmon check predictions outcomes`` joins
        two files (:mod:`calmon.api.join`); ``id`` defaults to the ``id`` column of both.
    score, label, probs, id, ts
        Columns of ``data`` (names) or arrays: binary ``score`` (P(y = 1)) or multiclass ``probs`` (a column
        of vectors, a list of columns, or an (n, K) array), and ``label`` (0/1 or booleans; class indices for
        probs). Defaults: the columns ``score``/``probs``/``p0..p{K-1}``, ``label``, ``id``, ``ts`` when present.
    model
        The model to check when ``data`` has a ``model`` column of several (``--model``); else its name.
    tests
        Testers to run, as ``--tests``: ``"tcal,smce"`` (the default), a list, or ``"none"`` for metrics only.
    alpha, mc, seed, bins, reliability_bins
        As ``--alpha``, ``--mc``, ``--seed``, ``--bins``, ``--reliability-bins`` (``None``: the command's default).
    test_params
        Tester options, as ``--test-param``: ``{"lp": {"eps": 0.05}}``.
    reference
        Data to compare with (``--reference``): the permutation test of a calibration change, same columns.
    source
        The name shown as the input (default ``<DataFrame>``, ``<dict>``, ``<arrays>``).

    Returns
    -------
    CheckResult
        ``.verdict``, ``.calibrated``, ``.metrics``, ``.tests``, ``.summary``; ``.to_dict()`` is the JSON
        document of ``calmon check --json``; shown in a notebook as the report.

    Raises
    ------
    ValueError
        Inputs that ``calmon check`` would refuse, in one line naming the argument, row and value.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> p = rng.uniform(0.05, 0.95, 2000)
    >>> df = {"score": p, "label": rng.uniform(size=2000) < p}   # or a pandas / polars DataFrame
    >>> r = check(df)
    >>> r.calibrated, r.n, sorted(r.tests)
    (True, 2000, ['smce', 'tcal'])
    >>> r.verdict.startswith("Calibrated")   # in words: how, where, and what to do next
    True
    >>> round(r.metrics["ece"], 3) < 0.05
    True
    >>> check(df, tests="none").calibrated is None   # metrics only: no verdict
    True
    >>> preds = {"id": np.arange(2000), "score": p}       # predictions and outcomes in two frames
    >>> outs = {"id": np.arange(2000)[::-1], "label": df["label"][::-1]}
    >>> check(preds, outs).metrics == r.metrics           # joined by id
    True
    """
    if outcomes is not None:
        ds = joined_dataset(data, outcomes, score=score, probs=probs, label=label, id="id" if id is None else id,
                            ts=ts, model=model)
        if source is not None:
            ds.source = source
    else:
        ds = to_dataset(data, score=score, label=label, probs=probs, id=id, ts=ts, model=model, source=source)
    names = ",".join(tests) if isinstance(tests, (list, tuple)) else tests
    items = [f"{t}.{k}={json.dumps(v)}" for t, opts in (test_params or {}).items() for k, v in opts.items()]
    args = command_args(check_command, "check", tests=names, alpha=alpha, mc=mc, seed=seed, bins=bins,
                        reliability_bins=reliability_bins, test_param=items or None)
    check_command.check_numbers(args)
    doc = check_command.report(ds, args)
    if reference is not None:
        ref = to_dataset(reference, score=score, label=label, probs=probs, id=id, ts=ts, model=model,
                         source="<reference>")
        doc["reference"] = check_command.compare(ref, ds, args)
    return CheckResult(clean(doc), ds, args.bins)


@dataclass(frozen=True)
class CheckResult:
    """What :func:`check` found: the ``calmon check --json`` document, with attributes for its parts."""

    document: dict[str, Any]
    dataset: Dataset = field(repr=False)
    bins: int = field(default=4096, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``calmon check --json`` (a deep copy: JSON types only)."""
        out: dict[str, Any] = json.loads(json.dumps(self.document, allow_nan=False))
        return out

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text, as ``calmon check --json`` prints it."""
        return json.dumps(self.document, indent=indent, allow_nan=False)

    @property
    def verdict(self) -> str:
        """The verdict in words: calibrated or not, how, where, and what to do next."""
        return str(self.document["summary"]["text"])

    @property
    def calibrated(self) -> bool | None:
        """``True``/``False`` as the tests decided; ``None`` when no test ran or none could decide."""
        value = self.document["summary"]["calibrated"]
        return None if value is None else bool(value)

    @property
    def summary(self) -> dict[str, Any]:
        """The verdict's parts: ``calibrated``, ``direction``, ``regions``, ``ece_ci``, ``recommendation``..."""
        return dict(self.document["summary"])

    @property
    def metrics(self) -> dict[str, Any]:
        """ECE, Brier score, accuracy, mean confidence, l2-ECE estimates..."""
        return dict(self.document["metrics"])

    @property
    def tests(self) -> dict[str, dict[str, Any]]:
        """Each tester's result by name (``decision``, ``p_value``, ``statistic``, ``method``...)."""
        return dict(self.document.get("tests", {}))

    @property
    def n(self) -> int:
        return int(self.document["n"])

    def __repr__(self) -> str:
        return check_command.render(self.document)

    def _repr_html_(self) -> str:
        """The report inline in a notebook: verdict, metrics and tests, and the reliability diagram (SVG)
        when matplotlib (the ``report`` extra) is installed."""
        d = self.document
        rows = [("verdict", d["summary"]["text"]), ("predictions", f"{d['n']:,} ({d['kind']})")]
        rows += [(k, _fmt(v)) for k, v in d["metrics"].items() if k not in ("count", "classes")]
        tests = [(name, r.get("decision"), _fmt(r.get("p_value")), r.get("method")) for name, r in self.tests.items()]
        parts = [f"<div class='calmon-check'><b>calmon check</b> {html.escape(str(d.get('input')))}",
                 _table(("", ""), rows)]
        if tests:
            parts.append(_table(("test", "decision", "p-value", "method"), tests))
        parts.append(self._diagram())
        parts.append("</div>")
        return "".join(parts)

    def _diagram(self) -> str:
        try:
            from calmon.report import grid_panel
            from calmon.report.figures import draw_reliability, figure_svg, new_figure
        except MissingExtra as exc:  # the tables above are the report; say how to get the figure
            return f"<p><i>{html.escape(str(exc))} (for the reliability diagram)</i></p>"
        stats = check_command.build_stats(self.dataset, self.bins)
        top = self.dataset.top_label_only or self.dataset.classes > 2
        panel = grid_panel("main", "top-label confidence vs accuracy" if top else "binary score vs outcome rate",
                           stats.ece)
        fig, axes = new_figure([3.5, 1.2])
        draw_reliability(axes[0], axes[1], panel.bars, panel.name, panel.title, panel.after)
        return f"<div style='max-width:520px'>{figure_svg(fig)}</div>"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.4g}"
    return "n/a" if v is None else str(v)


def _table(head: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head) if any(head) else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table>{f'<tr>{th}</tr>' if th else ''}{body}</table>"
