"""The layering of docs/architecture.md, checked: pure rooms import nothing from the runtime side, and the
size limits of the style guide hold."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PURE = ("calmon/algorithms", "calmon/stats")
FORBIDDEN = ("calmon.agent", "calmon.exporter", "calmon.testers", "calmon.config", "calmon.alerts",
             "calmon.commands", "calmon.exporter.status.page", "connectors")
MAX_MODULE_LINES = 620
MAX_FUNCTION_LINES = 100


def _modules(*roots: str) -> list[Path]:
    return sorted(p for r in roots for p in (ROOT / r).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize("path", _modules(*PURE), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_rooms_import_no_runtime(path):
    bad = sorted(m for m in _imports(path) if m.startswith(FORBIDDEN))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_importing_algorithms_registers_nothing():
    """Importing every algorithm and statistic module leaves the tester table unimported."""
    mods = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in _modules(*PURE)]
    mods = [m.removesuffix(".__init__") for m in mods]
    code = ("import importlib, sys\n"
            f"for m in {mods!r}: importlib.import_module(m)\n"
            "runtime = ('calmon.testers', 'calmon.agent', 'calmon.config')\n"
            "bad = sorted(m for m in sys.modules if m.startswith(runtime))\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def _function_sizes(path: Path) -> list[tuple[str, int]]:
    """Lines of each function from its ``def`` to its end, not counting its docstring."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                n -= (first.end_lineno or first.lineno) - first.lineno + 1
            out.append((f"{path.relative_to(ROOT)}:{node.name}", n))
    return out


def test_module_and_function_sizes():
    mods = _modules("calmon", "connectors")
    big = [(str(p.relative_to(ROOT)), n) for p in mods if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not big, f"modules over {MAX_MODULE_LINES} lines: {big}"
    long = [(f, n) for p in mods for f, n in _function_sizes(p) if n > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
