"""Configuration: schema validation with key paths, environment overrides, shipped YAML files, exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calmon.config import ConfigError, build_config, load_config, parse_duration

ROOT = Path(__file__).resolve().parents[1]
BASE = {"sources": [{"path": "events.jsonl"}]}


def err(doc, env=None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build_config(doc, env=env or {})
    return info.value


def test_defaults_and_paths(tmp_path):
    cfg = build_config(BASE, env={}, base_dir=tmp_path)
    assert cfg.sources[0].path == str(tmp_path / "events.jsonl")
    assert cfg.state_dir == str(tmp_path / "calmon-state")
    assert cfg.windows.window_seconds() == {"1h": 3600.0, "24h": 86400.0, "7d": 604800.0, "all": None}
    assert cfg.model("anything").bins == 1024


@pytest.mark.parametrize("doc,path,why", [
    ({**BASE, "exporter": {"prot": 1}}, "exporter.prot", "unknown key"),
    ({**BASE, "exporter": {"port": 70000}}, "exporter.port", "[0, 65535]"),
    ({**BASE, "exporter": {"port": "http"}}, "exporter.port", "integer"),
    ({**BASE, "join": {"ttl": "soon"}}, "join.ttl", "duration"),
    ({**BASE, "models": {"m": {"bins": 1000}}}, "models.m.bins", "power of two"),
    ({**BASE, "models": {"m": {"segments": ["all"]}}}, "models.m.segments", "reserved"),
    ({**BASE, "windows": {"names": ["1h", "30d"]}}, "windows.names.1", "span"),
    ({**BASE, "windows": {"tiers": [{"width": "5m", "count": 3}, {"width": "7m", "count": 2}]}},
     "windows.tiers.1.width", "multiple"),
    ({**BASE, "evaluation": {"alpha": 1.5}}, "evaluation.alpha", "(0, 1)"),
    ({**BASE, "evaluation": {"tests": [{"name": "tcal", "parms": {}}]}}, "evaluation.tests.0.parms", "unknown key"),
    ({**BASE, "sources": [{"type": "ftp", "path": "x"}]}, "sources.0.type", "one of"),
    ({"sources": [{"type": "file"}]}, "sources.0.path", "required"),
    ({"sources": []}, "sources", "at least one"),
    ({**BASE, "exporter": {"tls": {"cert_file": "/nonexistent.pem", "key_file": "/nonexistent.key"}}},
     "exporter.tls.cert_file", "not found"),
    ({**BASE, "exporter": {"basic_auth": {"username": "u"}}}, "exporter.basic_auth", "go together"),
    ({**BASE, "join": {"ttl": "2d"}, "windows": {"allowed_lateness": "1d"}}, "windows.allowed_lateness", "join.ttl"),
    ({**BASE, "checkpoint": {"enabled": "yes"}}, "checkpoint.enabled", "true or false"),
])
def test_errors_name_the_key_path(doc, path, why):
    e = err(doc)
    assert e.path == path and why in e.reason, str(e)
    assert str(e).startswith(path + ": ")


def test_environment_overrides_and_substitution():
    env = {"CALMON__EXPORTER__PORT": "9100", "CALMON__SOURCES__0__FOLLOW": "true",
           "CALMON__EVALUATION__TESTS": "[tcal, smce]", "PW": "s3cret", "CALMON__MODELS__FRAUD__BINS": "4096"}
    doc = {**BASE, "exporter": {"basic_auth": {"username": "u", "password": "${PW}"},
                                "address": "${ADDR:-0.0.0.0}"}}
    cfg = build_config(doc, env=env)
    assert cfg.exporter.port == 9100 and cfg.sources[0].follow is True
    assert [t.name for t in cfg.evaluation.tests] == ["tcal", "smce"]
    assert cfg.exporter.basic_auth.password == "s3cret" and cfg.exporter.address == "0.0.0.0"
    assert cfg.models["fraud"].bins == 4096
    e = err(doc, env={"CALMON__EXPORTER__PORT": "x", "PW": "p"})
    assert e.path == "exporter.port"
    e = err({**BASE, "exporter": {"basic_auth": {"username": "u", "password": "${NOPE}"}}})
    assert e.path == "exporter.basic_auth.password" and "NOPE" in e.reason


def test_durations():
    assert parse_duration("250ms") == 0.25 and parse_duration("2w") == 1209600.0 and parse_duration(5) == 5.0
    for bad in ("-1s", "5 parsecs", True, None, float("inf")):
        with pytest.raises(ConfigError):
            parse_duration(bad, "x")


def test_shipped_example_is_valid_and_complete():
    cfg = load_config(ROOT / "config" / "calmon.example.yaml", env={})
    text = (ROOT / "config" / "calmon.example.yaml").read_text()
    # every schema field of every section appears (documented) in the example
    for section, value in cfg.to_dict().items():
        assert f"{section}:" in text, section
        if isinstance(value, dict) and section != "models":
            for key in value:
                assert f"{key}:" in text, f"{section}.{key}"
    from calmon.agent.runtime import Agent
    Agent(cfg)  # testers and alert rules of the example exist and validate


def test_demo_yaml_is_the_demo_config():
    from calmon.commands.demo import DEMO_CONFIG
    assert yaml.safe_load((ROOT / "config" / "demo.yaml").read_text()) == DEMO_CONFIG
    build_config(DEMO_CONFIG, env={})


def test_run_exits_2_with_the_key_path(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources:\n  - path: x.jsonl\nexporter:\n  port: 123456\n")
    p = subprocess.run([sys.executable, "-m", "calmon.commands.run", "-c", str(bad)], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "exporter.port" in lines[0] and "65535" in lines[0] and "Traceback" not in p.stderr
    bad.write_text("sources: [\n")
    p = subprocess.run([sys.executable, "-m", "calmon.commands.run", "-c", str(bad)], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and "invalid YAML" in p.stderr
    bad.write_text("sources:\n  - path: x.jsonl\nevaluation:\n  tests: [nosuchtest]\n")
    p = subprocess.run([sys.executable, "-m", "calmon.commands.run", "-c", str(bad)], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and "evaluation.tests.0.name" in p.stderr and "unknown tester" in p.stderr


# -- hostile configuration (issue #14): exit 2 and one line naming the key, never a traceback ----------------------
def run_main(tmp_path, text: str, *args: str, env: dict | None = None, capsys=None) -> tuple[int, str]:
    """``calmon run -c <text>`` in-process; returns the exit code and stderr."""
    import os

    from calmon.commands import run as run_cmd
    cfg = tmp_path / "hostile.yaml"
    cfg.write_text(text)
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        code = run_cmd.main(["-c", str(cfg), *args])
    finally:
        os.environ.clear()
        os.environ.update(old)
    return code, capsys.readouterr().err


GOOD = "state_dir: {d}/state\nsources: [{{path: {d}/ev.jsonl}}]\nexporter: {{enabled: false}}\n"


@pytest.mark.parametrize("extra,env,needle", [
    ("recalibration: {enabled: true, methods: [bogus]}\n", {}, "recalibration.methods"),
    ("evaluation: {tests: [{name: tcal, params: {nosuch: 1}}]}\n", {}, "evaluation.tests.0.params"),
    ("ingest: {poll_timeout: 0}\n", {}, "ingest.poll_timeout"),
    ("", {"CALMON__EXPORTER__PORT__X": "1"}, "exporter.port"),
    ("", {"CALMON__SOURCES__0__PATH__DEEP": "1"}, "sources.0.path"),
    ("", {"CALMON__SOURCES__7__PATH": "x"}, "sources.7"),
    ("exporter: {idle_timeout: 0}\n", {}, "exporter.idle_timeout"),
    ("exporter: {max_connections: 0}\n", {}, "exporter.max_connections"),
    ("nested: " + "[" * 5000 + "]" * 5000 + "\n", {}, "nested deeper than"),
    ("x: &a [*a]\n", {}, "refers to itself"),
])
def test_bad_configuration_exits_2_with_one_line(tmp_path, capsys, extra, env, needle):
    code, err_text = run_main(tmp_path, GOOD.format(d=tmp_path) + extra, "--check-config", env=env, capsys=capsys)
    assert code == 2, err_text
    lines = err_text.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err_text, err_text


def test_billion_laughs_is_refused_quickly(tmp_path, capsys):
    laughs = 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
        f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10))
    code, err_text = run_main(tmp_path, GOOD.format(d=tmp_path) + laughs, "--check-config", capsys=capsys)
    assert code == 2 and "expands to more than" in err_text and len(err_text.strip().splitlines()) == 1
    # anchors within the bounds keep working, and !!python tags stay refused
    from calmon.config.loader import load_yaml
    assert load_yaml("base: &b {x: 1}\nc: {<<: *b, y: 2}\n") == {"base": {"x": 1}, "c": {"x": 1, "y": 2}}
    with pytest.raises(yaml.YAMLError):
        load_yaml("!!python/object/apply:os.system [echo hi]")


@pytest.mark.parametrize("extra,needle", [
    ("sources: [{{path: {d}/ev.jsonl, options: {{no_such_option: 1}}}}]\n", "sources.0.options"),
    ("dead_letter: {{type: file, path: dl.jsonl, options: {{no_such_option: 1}}}}\n", "dead_letter.options"),
])
def test_bad_connector_options_exit_2_naming_the_key(tmp_path, capsys, extra, needle):
    text = "state_dir: {d}/state\nexporter: {{enabled: false}}\n" + extra
    if "sources" not in extra:
        text += "sources: [{{path: {d}/ev.jsonl}}]\n"
    (tmp_path / "ev.jsonl").write_text("")
    code, err_text = run_main(tmp_path, text.format(d=tmp_path), capsys=capsys)
    assert code == 2, err_text
    lines = err_text.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "no_such_option" in lines[0], err_text


def test_join_ttl_alone_is_enough() -> None:
    """Setting only ``join.ttl`` beyond the default lateness raises the lateness with it (#32.4)."""
    from calmon.config import ConfigError, build_config

    cfg = build_config({"sources": [{"path": "x"}], "join": {"ttl": "30d"}}, env={})
    assert cfg.join.ttl == cfg.windows.allowed_lateness == 30 * 86400
    cfg = build_config({"sources": [{"path": "x"}], "join": {"ttl": "21h"}}, env={})
    assert cfg.join.ttl == 21 * 3600 and cfg.windows.allowed_lateness == 7 * 86400  # the default already covers it
    cfg = build_config({"sources": [{"path": "x"}]}, env={"CALMON__JOIN__TTL": "10d"})
    assert cfg.windows.allowed_lateness == 10 * 86400
    with pytest.raises(ConfigError, match="windows.allowed_lateness"):  # set explicitly below the TTL: an error
        build_config({"sources": [{"path": "x"}], "join": {"ttl": "30d"}, "windows": {"allowed_lateness": "1d"}},
                     env={})
