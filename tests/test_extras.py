"""#32.8: the heavy optional packages are extras; a feature without its extra says so in one line (exit 2).

The packages are hidden with a meta-path blocker (an import of them raises ``ModuleNotFoundError`` as on a base
install), in a subprocess for the command line and in-process (monkeypatched) for the file source.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Run calmon's command line with ``BLOCKED`` packages hidden (what a base install without the extras sees).
BLOCKER = textwrap.dedent("""
    import sys
    BLOCKED = {blocked!r}
    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None
    sys.meta_path.insert(0, Blocker())
    from calmon.cli import main
    sys.exit(main({argv!r}))
""")


def run_blocked(blocked: set[str], argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    code = BLOCKER.format(blocked=sorted(blocked), argv=argv)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def labeled(n: int, prefix: str = "e") -> list[bytes]:
    return [json.dumps({"type": "labeled", "id": f"{prefix}{i}", "model": "m", "score": (i % 9 + 0.5) / 10,
                        "label": i % 2}).encode() for i in range(n)]


def write_parquet(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"score": [0.2, 0.7, 0.9], "label": [0, 1, 1]}), path)


def test_report_without_matplotlib_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    data = tmp_path / "events.jsonl"
    data.write_bytes(b"\n".join(labeled(50)) + b"\n")
    res = run_blocked({"matplotlib"}, ["report", str(data), "-o", str(tmp_path / "r.html"), "--tests", "none"],
                      tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == ["calmon report needs matplotlib: pip install 'calmon[report]'"]
    assert not (tmp_path / "r.html").exists()


def test_check_of_parquet_without_pyarrow_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    write_parquet(tmp_path / "t.parquet")
    res = run_blocked({"pyarrow"}, ["check", str(tmp_path / "t.parquet"), "--tests", "none"], tmp_path)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert lines[0].endswith("t.parquet: reading .parquet needs pyarrow: pip install 'calmon[parquet]'")


def test_check_of_jsonl_needs_no_extra(tmp_path: Path) -> None:
    data = tmp_path / "events.jsonl"
    data.write_bytes(b"\n".join(labeled(50)) + b"\n")
    res = run_blocked({"pyarrow", "matplotlib", "confluent_kafka", "rich", "sklearn"},
                      ["check", str(data), "--json", "--tests", "none"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["n"] == 50


class _Blocker:
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def hide(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make ``names`` unimportable for the rest of the test (restored by monkeypatch)."""
    for mod in list(sys.modules):
        if mod.partition(".")[0] in names:
            monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(sys, "meta_path", [_Blocker(set(names)), *sys.meta_path])


def test_file_source_skips_parquet_without_pyarrow_and_reads_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    from connectors.files import FileSource

    d = tmp_path / "drop"
    d.mkdir()
    (d / "a.jsonl").write_bytes(b"\n".join(labeled(20, "a")) + b"\n")
    write_parquet(d / "b.parquet")
    hide(monkeypatch, "pyarrow")
    src = FileSource(d, follow=False, settle=0.0, poll_interval=0.01)
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while not src.rejected_files and time.monotonic() < deadline:  # poll: a loaded CI machine is slow
        batch = src.read(timeout=0.05)
        if batch is not None:
            got.extend(batch.records)
    for _ in range(5):
        batch = src.read(timeout=0.05)
        if batch is not None:
            got.extend(batch.records)
    assert got == labeled(20, "a")
    assert src.rejected_files == {"needs_pyarrow": 1}
    assert src.errors == [f"{d / 'b.parquet'}: reading .parquet needs pyarrow: pip install 'calmon[parquet]'"]


def test_progress_without_rich_is_a_plain_line_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from calmon.commands.progress import Steps

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    hide(monkeypatch, "rich")
    out = Tty()
    with Steps(2, stream=out) as steps:
        steps.start("read")
        steps.done()
    text = out.getvalue()
    assert "calmon: read (0/2)" in text and "calmon: read (1/2)" in text and text.endswith("\r\033[K")
    quiet = io.StringIO()  # not a terminal: nothing at all
    with Steps(2, stream=quiet) as steps:
        steps.start("read")
        steps.done()
    assert quiet.getvalue() == ""


def test_pyproject_base_install_is_light_and_extras_name_the_heavy_parts() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11 (CI's)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
                for r in reqs}

    base = names(project["dependencies"])
    assert {"numpy", "scipy", "river", "prometheus-client", "kafka-python", "pyyaml"} <= base  # the design's
    assert not {"pyarrow", "matplotlib", "confluent-kafka", "rich", "pytest", "scikit-learn"} & base
    extras = project["optional-dependencies"]
    assert names(extras["parquet"]) == {"pyarrow"}
    assert names(extras["report"]) == {"matplotlib"}
    assert names(extras["kafka-fast"]) == {"confluent-kafka"}
    assert "deploy" in extras
    everything = " ".join(extras["all"])
    for feature in ("parquet", "report", "kafka-fast", "deploy"):
        assert feature in everything
    assert "test" not in everything and not {"pytest", "ruff", "mypy"} & names(extras["all"])
    # the tests exercise every optional feature: the test extra pulls them
    assert all(f in " ".join(extras["test"]) for f in ("parquet", "report", "kafka-fast"))
