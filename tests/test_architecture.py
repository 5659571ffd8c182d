"""The layering of docs/architecture.md, checked: the import contracts of pyproject.toml (``lint-imports``) hold
and catch a violation, no import cycle joins calmon's packages and ``connectors``, and importing the pure rooms
(algorithms, statistics) loads nothing of the runtime side.

Modules are cut by concept, not by length: there is no size limit here.  Two halves of one concept import each
other, which the ``acyclic_siblings`` contract reports.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PURE = ("calmon/algorithms", "calmon/stats")
#: ``lint-imports`` of the importing interpreter, without a cache directory and the logo.
LINT = [sys.executable, "-c",
        "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"]


def _modules(*roots: str) -> list[Path]:
    return sorted(p for r in roots for p in (ROOT / r).rglob("*.py"))


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(LINT, capture_output=True, text=True, cwd=cwd, timeout=300)


def test_import_contracts_hold():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def _copy_tree(dst: Path) -> None:
    """calmon, connectors and pyproject.toml: what ``lint-imports`` reads (the copy is imported first, from the
    working directory)."""
    for pkg in ("calmon", "connectors"):
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("calmon/stats/__init__.py", "from calmon.evaluate import round as _round  # noqa: F401",
     "calmon.stats is not allowed to import calmon.evaluate"),
    ("calmon/events/rows.py", "import connectors.base  # noqa: F401",
     "calmon.events is not allowed to import connectors"),
    ("calmon/algorithms/tcal/estimators.py", "from calmon.algorithms.tcal import atoms as _atoms  # noqa: F401",
     "No cycles are allowed in calmon.algorithms.tcal"),
])
def test_import_contracts_catch_a_violation(tmp_path: Path, module: str, line: str, broken: str):
    """One import against the layers, the wiring rule or the cycles, added to a copy of the tree."""
    _copy_tree(tmp_path)
    with (tmp_path / module).open("a", encoding="utf-8") as fh:
        fh.write("\n" + line + "\n")
    out = _lint(tmp_path)
    assert out.returncode != 0
    assert broken in out.stdout, out.stdout + out.stderr


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the directed graph ``edges`` (node -> successors), or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def _package_imports(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    """Which of calmon's packages (and top-level modules) and ``connectors`` import which, lazy imports too."""
    nodes = sorted(graph.find_children("calmon")) + ["connectors"]
    return {a: {b for b in nodes if b != a and graph.direct_import_exists(importer=a, imported=b, as_packages=True)}
            for a in nodes}


def test_no_import_cycle_between_packages():
    edges = _package_imports(grimp.build_graph("calmon", "connectors", cache_dir=None))
    assert edges["calmon.agent"] and "connectors" in edges["calmon.agent"]  # the graph was read
    assert _cycle(edges) is None, _cycle(edges)


def test_a_package_cycle_is_found():
    """The check above on the same graph with one import upward added: it must report the cycle."""
    graph = grimp.build_graph("calmon", "connectors", cache_dir=None)
    graph.add_import(importer="connectors.base", imported="calmon.agent.build")  # the agent imports connectors
    cycle = _cycle(_package_imports(graph))
    assert cycle is not None and "connectors" in cycle and "calmon.agent" in cycle


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
