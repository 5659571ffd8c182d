"""Child processes of the benchmarks: which tree's packages they import is set by ``PYTHONPATH``.

A benchmark that measures in a fresh interpreter (its own peak RSS, or another tree's code: ``--baseline DIR``
with ``DIR`` from ``git archive REV calmon connectors | tar -x -C DIR``) runs ``python -m benchmarks.NAME`` with
``PYTHONPATH`` = the tree under test (by default the directory of the ``calmon`` this process imports), then this
checkout (for the ``benchmarks`` package itself), then the caller's ``PYTHONPATH``; nothing edits ``sys.path``.
The child's working directory is ``/``: ``python -m`` puts the working directory first on ``sys.path``, where a
checkout's ``calmon`` would shadow the tree under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["NEUTRAL", "ROOT", "TESTS", "child_env", "current", "last_json", "module_cmd", "run_module"]

#: The checkout holding this package (its ``calmon`` and ``connectors`` are the "current" tree).
ROOT = Path(__file__).resolve().parents[1]
#: The test suite's directory: its helpers (``kafka_broker``, ``test_cluster_kafka``) import each other by
#: module name, so a child that uses them gets this directory on its ``PYTHONPATH``.
TESTS = ROOT / "tests"
NEUTRAL = "/"


def current() -> Path:
    """The directory holding the ``calmon`` (and ``connectors``) this process imports: the "current" tree."""
    import calmon

    return Path(calmon.__file__ or "").resolve().parents[1]


def child_env(code: str | Path | None = None, *, tests: bool = False, **extra: str) -> dict[str, str]:
    """The environment of a child importing ``calmon`` from ``code`` (default: :func:`current`).

    Examples
    --------
    >>> env = child_env("/tmp/base", OPENBLAS_NUM_THREADS="1")
    >>> env["PYTHONPATH"].split(os.pathsep)[:2] == ["/tmp/base", str(ROOT)], env["OPENBLAS_NUM_THREADS"]
    (True, '1')
    >>> child_env()["PYTHONPATH"].split(os.pathsep)[0] == str(current())
    True
    """
    paths = [str(current() if code is None else code), str(ROOT)] + ([str(TESTS)] if tests else [])
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}


def module_cmd(module: str, *args: object) -> list[str]:
    """``python -m module args...`` with this interpreter."""
    return [sys.executable, "-m", module, *(str(a) for a in args)]


def run_module(module: str, *args: object, code: str | Path | None = None, tests: bool = False,
               env: dict[str, str] | None = None, check: bool = True,
               timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args...`` in a child (see :func:`child_env`), output captured as text.

    With ``check`` a failing child raises :class:`RuntimeError` carrying the end of its stderr.
    """
    res = subprocess.run(module_cmd(module, *args), env=child_env(code, tests=tests, **(env or {})), cwd=NEUTRAL,
                         capture_output=True, text=True, check=False, timeout=timeout)
    if check and res.returncode:
        raise RuntimeError(f"{module} {' '.join(map(str, args))} failed (exit {res.returncode}):\n"
                           f"{res.stderr[-4000:]}")
    return res


def last_json(stdout: str) -> Any:
    """The JSON document on the last line of a child's output (children print one JSON line last)."""
    return json.loads(stdout.strip().splitlines()[-1])
