"""#32.8: imports are lazy -- which modules a command loads, not how long it takes (a module-set test).

``python -X importtime`` lists every module a process imports; ``calmon --version`` must load none of the heavy
packages and ``calmon check`` on JSON Lines none it does not use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Heavy packages (import cost 0.1-2 s each, or optional extras).
HEAVY = {"scipy", "matplotlib", "pyarrow", "sklearn", "kafka", "confluent_kafka", "river", "rich", "pandas"}


def imported(code: str, cwd: Path | None = None) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """Top-level packages a fresh interpreter imports running ``code`` (from ``-X importtime``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                         env=env, cwd=cwd or ROOT, timeout=300)
    names = set()
    for line in res.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":  # the header line
                names.add(name.partition(".")[0])
    return names, res


def cli(argv: list[str]) -> str:
    return f"import sys\nfrom calmon.cli import main\nsys.exit(main({argv!r}))"


def test_version_imports_no_heavy_package() -> None:
    names, res = imported(cli(["--version"]))
    from calmon import __version__

    assert res.returncode == 0 and res.stdout.strip() == f"calmon {__version__}", res.stderr[-2000:]
    assert "calmon" in names  # the parse saw the imports
    assert not HEAVY & names, sorted(HEAVY & names)
    assert "numpy" not in names  # nothing numeric at all to print a version


def test_import_calmon_is_light_and_the_api_is_reached_lazily() -> None:
    names, res = imported("import calmon; print(sorted(n for n in dir(calmon) if not n.startswith('_')))")
    assert res.returncode == 0, res.stderr[-2000:]
    assert not (HEAVY | {"numpy"}) & names
    assert {"check", "fit"} <= set(json.loads(res.stdout.replace("'", '"')))


def test_check_of_jsonl_imports_only_what_it_uses(tmp_path: Path) -> None:
    data = tmp_path / "events.jsonl"
    data.write_text("".join(json.dumps({"type": "labeled", "id": str(i), "model": "m", "score": (i % 9 + 0.5) / 10,
                                        "label": i % 2}) + "\n" for i in range(200)))
    names, res = imported(cli(["check", str(data), "--json"]), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["n"] == 200
    assert "scipy" in names  # the testers it runs
    assert not {"matplotlib", "pyarrow", "sklearn", "kafka", "confluent_kafka", "river", "rich", "pandas"} & names


def test_check_help_imports_no_heavy_package() -> None:
    """``check --help`` only builds the parser: no scipy, no tester (it imported them all, 1.8 s CPU, before)."""
    names, res = imported(cli(["check", "--help"]))
    assert res.returncode == 0 and "--schema" in res.stdout, res.stderr[-2000:]
    assert not HEAVY & names, sorted(HEAVY & names)


def test_lazy_registration_still_lists_and_parses_every_command() -> None:
    from calmon.cli import COMMANDS, build_parser

    full = build_parser()  # no argv: every command, as documentation generators and tests use it
    help_text = full.format_help()
    assert all(name in help_text for name in COMMANDS)
    for name in COMMANDS:
        only = build_parser([name, "--help"])
        assert only._subparsers is not None
        (action,) = [a for a in only._subparsers._group_actions]
        assert list(action.choices) == [name]  # type: ignore[attr-defined]
    (action,) = [a for a in build_parser(["--version"])._subparsers._group_actions]  # type: ignore[union-attr]
    assert list(action.choices) == []  # type: ignore[attr-defined]


def test_unknown_command_and_no_command_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from calmon.cli import main

    for argv, needle in ((["bogus"], "invalid choice: 'bogus' (choose from 'run', 'demo', 'check'"),
                         ([], "the following arguments are required: COMMAND")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert needle in capsys.readouterr().err
