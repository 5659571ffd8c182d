"""The generated reference pages match the code they document (issue #34.3).

``docs/gen_reference.py`` builds the configuration, metric, CLI and reason-code pages from the config schema, the
exporter, the argument parsers and the decoder's reason registry. These tests regenerate each page and compare it with
the committed one, and check that each generator sees everything its source defines, so a key, metric family, flag or
reason code added without ``python docs/gen_reference.py`` fails here.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))

import gen_reference  # noqa: E402


@pytest.mark.parametrize("name", sorted(gen_reference.PAGES))
def test_committed_page_is_current(name: str) -> None:
    committed = (ROOT / "docs" / "reference" / name).read_text()
    assert committed == gen_reference.PAGES[name](), (
        f"docs/reference/{name} is stale: run `python docs/gen_reference.py` and commit the result")


def _config_keys(cls: type, prefix: str = "") -> list[str]:
    import typing

    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        key = f"{prefix}{f.name}"
        out.append(key)
        tp = hints[f.name]
        args = typing.get_args(tp)
        if dataclasses.is_dataclass(tp):
            out += _config_keys(tp, key + ".")
        elif typing.get_origin(tp) is list and dataclasses.is_dataclass(args[0]):
            out += _config_keys(args[0], key + ".<n>.")
        elif typing.get_origin(tp) is dict and dataclasses.is_dataclass(args[1]):
            out += _config_keys(args[1], key + ".<name>.")
    return out


def test_configuration_page_has_every_key_with_type_default_and_rules() -> None:
    from calmon.config.schema import Config

    page = gen_reference.configuration_page()
    keys = _config_keys(Config)
    assert len(keys) > 80
    for key in keys:
        assert f"| `{key}` |" in page, key
    # rules come from validate(): a sample of each kind
    assert "| `models.<name>.bins` | integer | `1024` |" in page and "must be a power of two in [16, 65536]" in page
    assert "must be >= join.ttl" in page  # a rule across sections (Config.validate)


from calmon.config import schema as _schema  # noqa: E402


@dataclasses.dataclass
class _Join2(_schema.JoinConfig):
    #: A key added without regenerating.
    brand_new: int = 7


@dataclasses.dataclass
class _Config2(_schema.Config):
    join: _Join2 = dataclasses.field(default_factory=_Join2)


def test_a_new_configuration_key_changes_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_schema, "Config", _Config2)
    page = gen_reference.configuration_page()
    assert "| `join.brand_new` | integer | `7` | A key added without regenerating. |" in page
    assert page != (ROOT / "docs" / "reference" / "configuration.md").read_text()


def _literal_metric_names() -> set[str]:
    """Every ``calmon_*`` family name written as a literal in the exporter's code (f-string stems excluded)."""
    names: set[str] = set()
    for path in (ROOT / "calmon" / "exporter").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"calmon_[a-z0-9_]+[a-z0-9]", node.value):
                    names.add(node.value)
    return names


def test_metric_page_has_every_family_the_exporter_defines() -> None:
    page = gen_reference.metrics_page()
    documented = {m.group(1) for m in re.finditer(r"^\| `(calmon_[a-z0-9_]+)` \|", page, flags=re.M)}
    literals = _literal_metric_names()
    assert len(literals) > 30
    # counters are scraped with _total; every literal family must be documented under its scraped name
    missing = sorted(n for n in literals if n not in documented and f"{n}_total" not in documented)
    assert not missing, f"families defined in calmon/exporter but absent from the metric page: {missing}"
    from calmon.exporter.rounds import ESTIMATED, WINDOW_GAUGES

    for name in WINDOW_GAUGES:
        assert name in documented
    for m in ESTIMATED:
        assert {f"calmon_estimated_{m}", f"calmon_estimated_{m}_lower", f"calmon_estimated_{m}_upper"} <= documented
    row = next(ln for ln in page.splitlines() if ln.startswith("| `calmon_events_rejected_total` |"))
    assert "| counter | `reason` |" in row


def _cluster_family_names() -> set[str]:
    """Every ``calmon_cluster_*`` family ``calmon/cluster`` writes a HELP line for, read from the source.

    Literal names (``# HELP calmon_cluster_owned_partitions ...``) and the stems of the loops that format
    ``calmon_cluster_{name}`` from a ``(name, help, value)`` table (help a literal or a named constant).
    """
    names: set[str] = set()
    for path in (ROOT / "calmon" / "cluster").rglob("*.py"):
        text = path.read_text()
        names.update(re.findall(r"# HELP (calmon_cluster_[a-z0-9_]+[a-z0-9]) ", text))
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, ast.FunctionDef):
                continue
            src = ast.get_source_segment(text, fn) or ""
            m = re.search(r"# HELP calmon_cluster_\{name\}(_total)? ", src)
            if not m:
                continue
            for node in ast.walk(fn):
                # (name, help, value): the help a literal or a module constant (GROUP_REPAIRS_HELP, shared by stages)
                if (isinstance(node, ast.Tuple) and len(node.elts) == 3
                        and isinstance(node.elts[0], ast.Constant) and isinstance(node.elts[0].value, str)
                        and (isinstance(node.elts[1], ast.Name)
                             or isinstance(node.elts[1], ast.Constant) and isinstance(node.elts[1].value, str))):
                    stem = node.elts[0].value  # type: ignore[attr-defined]
                    if re.fullmatch(r"[a-z0-9_]+", stem):
                        names.add(f"calmon_cluster_{stem}{m.group(1) or ''}")
    return names


def test_metric_page_has_every_cluster_family() -> None:
    page = gen_reference.metrics_page()
    section = page.split("## The partitioned agent's workers", 1)[1]
    documented = {m.group(1) for m in re.finditer(r"^\| `(calmon_cluster_[a-z0-9_]+)` \|", section, flags=re.M)}
    in_code = _cluster_family_names()
    assert len(in_code) >= 15, "the source scan found almost no calmon_cluster_* family: is it broken?"
    missing = sorted(n for n in in_code if n not in documented)
    assert not missing, f"calmon_cluster_* families in calmon/cluster absent from the metric page: {missing}"
    assert not sorted(documented - in_code), "the page documents a calmon_cluster_* family the code does not have"
    row = next(ln for ln in section.splitlines() if ln.startswith("| `calmon_cluster_lag_records` |"))
    assert "| gauge | `stage`, `worker`, `partition` |" in row


def test_a_new_cluster_family_changes_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    from calmon.cluster import ownership

    render = ownership.IngestMetrics.render

    def more(self: ownership.IngestMetrics) -> bytes:
        return render(self) + b"# HELP calmon_cluster_brand_new A family added without regenerating.\n" \
            b"# TYPE calmon_cluster_brand_new gauge\ncalmon_cluster_brand_new 1\n"

    monkeypatch.setattr(ownership.IngestMetrics, "render", more)
    page = gen_reference.metrics_page()
    assert "| `calmon_cluster_brand_new` | gauge | -- | A family added without regenerating. |" in page
    assert page != (ROOT / "docs" / "reference" / "metrics.md").read_text()


def test_cli_page_has_every_subcommand_and_flag() -> None:
    from calmon.cli import COMMANDS, build_parser

    page = gen_reference.cli_page()
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subs.choices) == set(COMMANDS)
    for name, sub in subs.choices.items():
        section = page.split(f"## `calmon {name}`", 1)[1].split("\n## ", 1)[0]
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in section or f", {flag}" in section, (name, flag)


def test_a_new_flag_changes_the_cli_page(monkeypatch: pytest.MonkeyPatch) -> None:
    import calmon.cli

    real = calmon.cli.build_parser

    def with_flag() -> argparse.ArgumentParser:
        p = real()
        subs = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        subs.choices["check"].add_argument("--brand-new-flag", help="added without regenerating")
        return p

    monkeypatch.setattr(calmon.cli, "build_parser", with_flag)
    page = gen_reference.cli_page()
    assert "| `--brand-new-flag BRAND_NEW_FLAG` |  | added without regenerating |" in page


def test_reason_page_lists_exactly_the_decoder_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    from calmon.events import checks

    page = gen_reference.reasons_page()
    for reason in checks.REASONS:
        assert f"| `{reason}` |" in page
    assert page.split("## Whole files")[0].count("\n| `") == len(checks.REASONS)
    monkeypatch.setattr(checks, "REASONS", (*checks.REASONS, "brand_new_reason"))
    with pytest.raises(SystemExit, match="undescribed \\['brand_new_reason'\\]"):
        gen_reference.reasons_page()


_REJECTING = {"InvalidEvent", "InvalidEventError", "reject", "reject_one", "Rejection", "OversizedRecord",
              "_whole_failed"}
_CODE = re.compile(r"[a-z]+(?:_[a-z]+)*")


def _reason_literals(tree: ast.AST) -> set[str]:
    """String literals where a reason is named: rejecting calls, ``reason=`` / ``reason = ``, ``rejects.append``."""
    found: set[str] = set()

    def const(node: ast.AST | None) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _CODE.fullmatch(node.value):
            found.add(node.value)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if fn in _REJECTING:
                for arg in node.args:
                    const(arg)
            if fn == "getattr" and len(node.args) == 3 and getattr(node.args[1], "value", None) == "reason":
                const(node.args[2])
            owner = getattr(node.func, "value", None)
            if fn == "append" and getattr(owner, "id", "") == "rejects" and node.args:
                if isinstance(node.args[0], ast.Tuple) and len(node.args[0].elts) > 1:
                    const(node.args[0].elts[1])
            for kw in node.keywords:
                if kw.arg == "reason":
                    const(kw.value)
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == "reason" for t in node.targets):
                const(node.value)
        elif isinstance(node, ast.arguments):
            names = [a.arg for a in node.args][-len(node.defaults):] if node.defaults else []
            for name, default in zip(names, node.defaults):
                if name == "reason":
                    const(default)
    return found


def test_every_reason_literal_is_registered_or_on_the_page() -> None:
    """Reasons are named as string literals where records (or whole files) are rejected: a record's must be in the
    registry, a whole file's among the page's file reasons -- and each file reason on the page still in the code."""
    from calmon.events.checks import REASONS

    record: set[str] = set()
    for path in (ROOT / "calmon" / "events").rglob("*.py"):
        record |= _reason_literals(ast.parse(path.read_text()))
    assert {"too_many_models", "unmapped_label", "too_large", "bad_type"} <= record, record
    unknown = sorted(record - set(REASONS))
    assert not unknown, f"reason codes used by the decoder but missing from REASONS: {unknown}"
    files: set[str] = set()
    for folder in (ROOT / "calmon" / "formats", ROOT / "connectors"):
        for path in folder.rglob("*.py"):
            files |= _reason_literals(ast.parse(path.read_text()))
    file_reasons = set(gen_reference.FILE_REASON_DOCS)
    unknown = sorted(files - set(REASONS) - file_reasons)
    assert not unknown, f"reasons used by the file source but absent from the reason page: {unknown}"
    stale = sorted(file_reasons - files)
    assert not stale, f"file reasons on the page that the code no longer uses: {stale}"
    page = gen_reference.reasons_page()
    for reason in file_reasons:
        assert f"| `{reason}` |" in page


def test_the_reason_scan_sees_a_new_literal() -> None:
    tree = ast.parse("v.reject(mask, 'brand_new_reason', 'a message')\nraise InvalidEvent('other_new', 'bad value')")
    assert _reason_literals(tree) == {"brand_new_reason", "other_new"}


def test_readme_changelog_and_site_name_the_project_version() -> None:
    import hooks

    version = hooks.project_version()
    assert version == __import__("calmon").__version__
    assert f"*This README describes calmon {version}.*" in (ROOT / "README.md").read_text()
    assert re.search(rf"^## {re.escape(version)} - \d{{4}}-\d\d-\d\d$", (ROOT / "CHANGELOG.md").read_text(), re.M)

    class Extra(dict):  # the part of MkDocs' config the hook touches
        pass

    class Config:
        extra = Extra()
        copyright = ""

    cfg = hooks.on_config(Config())
    page = hooks.on_page_markdown("# Title\n", None, cfg, None)
    assert f"This page describes calmon {version}." in page and page.endswith("# Title\n")


def test_api_reference_shows_sphinx_roles_as_code() -> None:
    pytest.importorskip("griffe")
    from griffe_rst import to_markdown

    assert to_markdown("a :class:`~calmon.client.Emitter`, :func:`load`, ``x``") == "a `Emitter`, `load`, `x`"
