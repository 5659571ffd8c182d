"""Hostile input, round two (issue #31).

* Writers replace only regular files: ``-o /dev/full`` (a device), a fifo, a socket, a directory or a
  symbolic link is refused in one line and left as it is (``calmon.formats.jsonio``, the checkpoint
  packs, the client's rotating file).
* No traceback for a schema nested 5000 deep, a 5000-key field path, an environment override that is
  not YAML, or numeric parameters far beyond what the command can hold (``--permutations 1e9``): one
  line and exit 2, with the bound in the message.
* Tester pool workers die with the agent however it dies (SIGKILL included) and do not hold its
  standard streams open.
* The emitter refuses a ``probs`` longer than the agent's class limit before converting it, and a
  value whose ``__float__`` raises is an invalid event (dropped and counted; ``ValueError`` if strict).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from calmon.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _labeled_file(path: Path, n: int = 300, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    z = rng.uniform(size=n)
    y = rng.uniform(size=n) < z
    path.write_text("".join(json.dumps({"id": str(i), "model": "m", "ts": 1767225600 + i, "score": float(z[i]),
                                        "label": int(y[i])}) + "\n" for i in range(n)))
    return path


def _cap_memory() -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    """``calmon ARGV`` in this process: its exit code and the lines it wrote to stderr."""
    capsys.readouterr()
    rc = main(list(argv))
    return rc, capsys.readouterr().err.splitlines()


# ------------------------------------------------------------------------------------------- 5. writers
def _special(kind: str, where: Path) -> Path:
    """A ``kind`` file system object at ``where`` (skips what this machine cannot make)."""
    if kind == "fifo":
        os.mkfifo(where)
    elif kind == "directory":
        where.mkdir()
    elif kind == "socket":
        if len(os.fsencode(where)) > 100:
            pytest.skip("socket path too long for AF_UNIX")
        s = socket.socket(socket.AF_UNIX)
        s.bind(os.fspath(where))
        s.close()
    elif kind == "device":  # /dev/full's numbers, made here: the real one is never touched
        try:
            os.mknod(where, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
        except (PermissionError, OSError) as exc:
            pytest.skip(f"cannot make a device node here: {exc}")
    elif kind == "symlink":
        target = where.with_name(where.name + ".target")
        target.write_text("keep me\n")
        where.symlink_to(target)
    else:  # pragma: no cover
        raise AssertionError(kind)
    return where


def _fmt(path: Path) -> int:
    return stat.S_IFMT(os.lstat(path).st_mode)


KINDS = ["device", "fifo", "socket", "directory", "symlink"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_atomic_writer_replaces_only_regular_files(tmp_path, kind):
    from calmon.formats.jsonio import write_bytes_atomic, write_json_atomic
    where = _special(kind, tmp_path / "out.json")
    before = _fmt(where)
    for write in (lambda: write_bytes_atomic(where, b"x\n"), lambda: write_json_atomic(where, {"a": 1})):
        with pytest.raises(OSError, match="not a regular file") as info:
            write()
        assert "\n" not in str(info.value) and str(where) in str(info.value)
    assert _fmt(where) == before  # left as it was
    if kind == "symlink":
        assert where.read_text() == "keep me\n"  # not followed either
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary file left behind


def test_the_atomic_writer_still_creates_and_replaces_regular_files(tmp_path):
    from calmon.formats.jsonio import write_json_atomic
    p = tmp_path / "sub" / "doc.json"
    write_json_atomic(p, {"a": 1})
    write_json_atomic(p, {"a": 2})
    assert json.loads(p.read_text()) == {"a": 2} and stat.S_ISREG(os.lstat(p).st_mode)


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_fit_and_report_refuse_to_replace_a_special_output_in_one_line(tmp_path, capsys, kind):
    data = _labeled_file(tmp_path / "d.jsonl")
    out = _special(kind, tmp_path / "out")
    before = _fmt(out)
    rc, err = _cli(capsys, "fit", str(data), "-m", "platt", "-o", str(out))
    assert rc == 2 and len(err) == 1 and "not a regular file" in err[0], err
    rc, err = _cli(capsys, "report", str(data), "--tests", "none", "-o", str(out))
    assert rc == 2 and len(err) == 1 and "not a regular file" in err[0], err
    assert _fmt(out) == before


def test_a_checkpoint_pack_is_never_renamed_over_a_special_file(tmp_path):
    from calmon.state.checkpoint.packs import PackWriter, pack_path
    os.mkfifo(pack_path(tmp_path, 7))
    w = PackWriter(tmp_path, 7)
    w.append(b'{"a":1}')
    with pytest.raises(OSError, match="not a regular file"):
        w.commit()
    assert stat.S_ISFIFO(os.lstat(pack_path(tmp_path, 7)).st_mode)


def test_the_client_file_sink_never_renames_a_device_away(tmp_path):
    from calmon.client.filesink import RotatingFileSink
    dev = _special("device", tmp_path / "events.jsonl")  # a /dev/full lookalike: writes fail, counted
    os.chmod(dev, 0o666)
    null = tmp_path / "null.jsonl"  # a /dev/null lookalike: writes succeed and would trigger rotation
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError as exc:  # pragma: no cover - _special skipped already
        pytest.skip(str(exc))
    sink = RotatingFileSink(null, max_bytes=30)
    for i in range(5):
        sink.write(str(i), b'{"id":"%d","label":1}\n' % i)
    sink.close()
    assert sink.counters()["sent"] == 5 and sink.counters()["rotations"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl", "null.jsonl"]
    assert stat.S_ISCHR(os.lstat(null).st_mode) and stat.S_ISCHR(os.lstat(dev).st_mode)


# ------------------------------------------------------------------------------- 6. one line, exit 2
def _deep_yaml(depth: int) -> str:
    return "fields: " + "[" * depth + "]" * depth + "\n"


@pytest.mark.parametrize("text", [_deep_yaml(5000), "".join(" " * i + "a:\n" for i in range(3000))],
                         ids=["lists", "mappings"])
def test_a_deeply_nested_schema_file_is_one_line(tmp_path, capsys, text):
    from calmon.events.schema import MappingError, load_mapping
    schema = tmp_path / "schema.yaml"
    schema.write_text(text)
    with pytest.raises(MappingError) as info:
        load_mapping(schema)
    assert "\n" not in str(info.value) and "nested" in str(info.value)
    rc, err = _cli(capsys, "check", str(_labeled_file(tmp_path / "d.jsonl")), "--schema", str(schema))
    assert rc == 2 and len(err) == 1, err


def test_a_very_long_field_path_is_refused_with_its_bound(tmp_path, capsys):
    from calmon.events.schema import MAX_PATH_KEYS, MappingError, load_mapping
    long = ".".join(["k"] * 5000)
    for spec in (long, "/" + "/".join(["k"] * 5000), {"path": long}):
        with pytest.raises(MappingError, match=f"at most {MAX_PATH_KEYS} keys"):
            load_mapping({"fields": {"score": spec}})
    with pytest.raises(MappingError, match=f"at most {MAX_PATH_KEYS} keys"):
        load_mapping({"fields": {"probs": ["a", long]}})
    data = str(_labeled_file(tmp_path / "d.jsonl"))
    rc, err = _cli(capsys, "check", data, "--map", f"score={long}")
    assert rc == 2 and len(err) == 1 and str(MAX_PATH_KEYS) in err[0], err
    (tmp_path / "s.yaml").write_text(f"fields:\n  score: {long}\n")
    rc, err = _cli(capsys, "check", data, "--schema", str(tmp_path / "s.yaml"))
    assert rc == 2 and len(err) == 1, err


def test_the_longest_allowed_path_still_decodes():
    from calmon.events.decoder import Decoder
    from calmon.events.schema import MAX_PATH_KEYS, load_mapping
    keys = [f"k{i}" for i in range(MAX_PATH_KEYS - 1)]
    m = load_mapping({"fields": {"score": ".".join([*keys, "p"]), "label": "y", "model": {"const": "m"}}})
    rec: dict = {"p": 0.25}
    for k in reversed(keys):
        rec = {k: rec}
    rec["y"] = 1
    out = Decoder(mapping=m).decode([json.dumps(rec).encode()])
    assert not out.rejected


@pytest.mark.parametrize("value", ["[unclosed", "{a: [1, 2", "a: b: c", "- x\n- y: [", "[" * 1000],
                         ids=["unclosed", "flow", "colons", "lines", "deep"])
def test_an_environment_override_that_is_not_yaml_is_one_line(value):
    from calmon.config import ConfigError, build_config
    with pytest.raises(ConfigError) as info:
        build_config({"sources": [{"path": "x"}]}, env={"CALMON__EXPORTER__PORT": value})
    assert "\n" not in str(info.value) and "CALMON__EXPORTER__PORT" in str(info.value)


def test_an_environment_override_deeper_than_a_document_may_be_is_refused():
    from calmon.config import ConfigError, build_config
    from calmon.config.loader import MAX_DEPTH
    var = "CALMON__EVALUATION__TESTS__0__PARAMS__" + "__".join(["a"] * 5000)
    with pytest.raises(ConfigError, match=f"deeper than {MAX_DEPTH}") as info:
        build_config({"sources": [{"path": "x"}]}, env={var: "1"})
    assert "\n" not in str(info.value)


def test_calmon_run_with_a_bad_override_prints_one_line(tmp_path):
    cfg = tmp_path / "calmon.yaml"
    cfg.write_text(f"sources: [{{path: {tmp_path / 'ev.jsonl'}}}]\n")
    res = subprocess.run([sys.executable, "-m", "calmon", "run", "-c", str(cfg), "--check-config"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "CALMON__EXPORTER__PORT": "[unclosed"})
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.parametrize(("argv", "bound"), [
    (["check", "{data}", "--reference", "{data}", "--tests", "none", "--permutations", "1000000000"], "8192"),
    (["check", "{data}", "--reference", "{data}", "--tests", "none", "--permutations", "99999999999999999999"],
     "8192"),
    (["check", "{data}", "--reference", "{data}", "--tests", "none", "--bins", "256", "--permutations", "200000"],
     "131072"),
    (["check", "{data}", "--tests", "none", "--bins", "1073741824"], "65536"),
    (["check", "{data}", "--tests", "smce", "--mc", "1000000000"], "1000000"),
    (["report", "{data}", "-o", "{tmp}/r.html", "--tests", "smce", "--mc", "1000000000"], "1000000"),
    (["fit", "{data}", "-m", "histogram", "-o", "{tmp}/c.json", "--bins", "1000000000"], "100000"),
    (["fit", "{data}", "-m", "histogram", "-o", "{tmp}/c.json", "--option", "bins=1000000000"], "100000"),
    (["fit", "{data}", "-m", "platt", "-o", "{tmp}/c.json", "--ece-bins", "1000000000"], "100000"),
    (["fit", "{data}", "-m", "platt", "-o", "{tmp}/c.json", "--ece-bins", "99999999999999999999"], "100000"),
    (["simulate", "-n", "10", "-o", "{tmp}/s.jsonl", "--classes", "1000000000"], "100000"),
    (["simulate", "-n", "10", "-o", "{tmp}/s.jsonl", "--rate", "nan"], "finite"),
    (["simulate", "-n", "10", "-o", "{tmp}/s.jsonl", "--start", "inf"], "finite"),
    (["simulate", "-n", "10", "-o", "{tmp}/s.jsonl", "--delay", "nan"], "finite"),
])
def test_parameters_beyond_their_bounds_are_one_line_naming_the_bound(tmp_path, argv, bound):
    data = _labeled_file(tmp_path / "d.jsonl")
    args = [a.format(data=data, tmp=tmp_path) for a in argv]
    # a subprocess with its address space capped: unchecked, these values ask for terabytes (or run for days)
    res = subprocess.run([sys.executable, "-m", "calmon", *args], capture_output=True, text=True, cwd=ROOT,
                         timeout=600, preexec_fn=_cap_memory)
    err = res.stderr.splitlines()
    assert res.returncode == 2 and len(err) == 1, res.stderr[-3000:]
    assert bound in err[0].replace(",", ""), err


def test_bounded_parameters_at_their_bounds_still_run(tmp_path, capsys):
    data = str(_labeled_file(tmp_path / "d.jsonl"))
    rc, err = _cli(capsys, "check", data, "--reference", data, "--tests", "none", "--bins", "16",
                   "--permutations", "999")
    assert rc == 0, err
    rc, err = _cli(capsys, "fit", data, "-m", "histogram", "-o", str(tmp_path / "c.json"), "--bins", "100000",
                   "--ece-bins", "100000")
    assert rc == 0, err


def test_run_tester_refuses_more_draws_than_it_can_use():
    from calmon.testers import MAX_MC, CalibrationData, run_tester
    d = CalibrationData(n=3, z=np.array([0.2, 0.5, 0.9]), y=np.array([0.0, 1.0, 1.0]), raw_is_complete=True)
    with pytest.raises(ValueError, match=f"at most {MAX_MC:,}"):
        run_tester("smce", d, mc=MAX_MC + 1)


def test_the_configuration_refuses_more_draws_than_a_tester_takes():
    from calmon.config import ConfigError, build_config
    from calmon.testers import MAX_MC
    doc = {"sources": [{"path": "x"}], "evaluation": {"mc": MAX_MC}}
    assert build_config(doc, env={}).evaluation.mc == MAX_MC
    with pytest.raises(ConfigError, match=str(MAX_MC)):
        build_config({**doc, "evaluation": {"mc": MAX_MC + 1}}, env={})


# ------------------------------------------------------------------------------------ 7. orphans
def _children(pid: int) -> set[int]:
    out: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            out.update(int(c) for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split())
        except OSError:
            pass
    return out


def _descendants(pid: int) -> set[int]:
    seen: set[int] = set()
    todo = [pid]
    while todo:
        for c in _children(todo.pop()):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time), or None if the process is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_tester_pool_workers_die_with_a_sigkilled_agent_and_release_its_streams(tmp_path):
    events = _labeled_file(tmp_path / "ev.jsonl", n=3000)
    cfg = tmp_path / "calmon.yaml"
    cfg.write_text(textwrap.dedent(f"""
        state_dir: {tmp_path / 'state'}
        sources: [{{path: {events}, follow: true}}]
        exporter: {{enabled: false}}
        windows: {{names: [all]}}
        evaluation: {{every: 1s, min_events: 50, pool: process, workers: 2, mc: 200,
                     tests: [{{name: smce}}, {{name: ldtc}}], cheap: []}}
        ingest: {{poll_timeout: 50ms}}
        """))
    agent = subprocess.Popen([sys.executable, "-m", "calmon", "run", "-c", str(cfg)], cwd=ROOT,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    streams: dict[str, bytes] = {}

    def drain(name: str, f) -> None:
        streams[name] = f.read()  # returns at EOF: when every holder of the pipe closed it

    readers = [threading.Thread(target=drain, args=(n, f), daemon=True)
               for n, f in (("stdout", agent.stdout), ("stderr", agent.stderr))]
    for r in readers:
        r.start()
    family: dict[int, str | None] = {}
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and agent.poll() is None:
            for pid in _descendants(agent.pid):
                family.setdefault(pid, _start_time(pid))
            if sum("spawn_main" in _cmdline(p) for p in family) >= 1:
                break
            time.sleep(0.1)
        assert agent.poll() is None, streams
        workers = [p for p in family if "spawn_main" in _cmdline(p)]
        assert workers, f"no tester worker started: {[_cmdline(p) for p in family]}"
        for pid in _descendants(agent.pid):  # whatever else started meanwhile (the resource tracker)
            family.setdefault(pid, _start_time(pid))
        agent.send_signal(signal.SIGKILL)
        agent.wait(60)
        for r in readers:
            r.join(120)
        assert not any(r.is_alive() for r in readers), "the agent's stdout/stderr stayed open after it died"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            left = [p for p, t in family.items() if t is not None and _start_time(p) == t]
            if not left:
                break
            time.sleep(0.1)
        assert not left, f"processes outlived the agent: {[_cmdline(p) for p in left]}"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(60)
        for p, t in family.items():  # never leave orphans behind, even when the test fails
            if t is not None and _start_time(p) == t:
                os.kill(p, signal.SIGKILL)


def test_worker_initializer_detaches_the_standard_streams(tmp_path):
    """In a spawned worker, fds 0, 1 and 2 are /dev/null (not the agent's pipes or terminal)."""
    code = textwrap.dedent("""
        import os, sys
        from concurrent.futures import ProcessPoolExecutor
        import multiprocessing
        from calmon.evaluate import pool

        def streams():
            return [os.path.realpath(f"/proc/self/fd/{i}") for i in (0, 1, 2)]

        if __name__ == "__main__":
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(1, mp_context=ctx, initializer=pool._worker_init,
                                     initargs=(os.getpid(),)) as ex:
                print(ex.submit(streams).result(120))
        """)
    script = tmp_path / "probe.py"
    script.write_text(code)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str([os.devnull] * 3), res.stdout


# ---------------------------------------------------------------------------------------- 8. emitter
class _Explodes:
    def __float__(self) -> float:
        raise RuntimeError("boom")

    def __index__(self) -> int:
        raise RuntimeError("boom")


def test_a_probs_longer_than_the_class_limit_is_refused_before_it_is_converted(tmp_path):
    from calmon.client import Emitter, InvalidEventError
    from calmon.client.events import MAX_CLASSES, prediction_event
    from calmon.events.decoder import Decoder
    assert MAX_CLASSES == Decoder().max_classes  # the agent's default limit

    class Counting(list):
        reads = 0

        def __iter__(self):
            Counting.reads += 1
            return super().__iter__()

    huge = Counting([1.0 / 1_000_000] * 1_000_000)
    with pytest.raises(InvalidEventError) as info:
        prediction_event("m", "r", probs=huge)
    assert info.value.reason == "too_many_classes" and Counting.reads == 0
    with pytest.raises(InvalidEventError, match="too_many_classes"):
        prediction_event("m", "r", probs=np.full(1_000_000, 1e-6))
    em = Emitter.to_file(tmp_path / "e.jsonl")
    em.prediction("m", probs=huge)
    em.labeled("m", 0, probs=np.full(MAX_CLASSES + 1, 1.0 / (MAX_CLASSES + 1)))
    assert em.prediction("m", probs=np.full(MAX_CLASSES, 1.0 / MAX_CLASSES))  # the limit itself is fine
    em.close()
    assert em.invalid_reasons() == {"too_many_classes": 2} and em.counters()["sent"] == 1
    wide = Emitter.to_file(tmp_path / "w.jsonl", max_classes=5000, strict=True)  # an agent configured wider
    wide.prediction("m", probs=np.full(4000, 1.0 / 4000))
    wide.close()
    assert wide.counters()["sent"] == 1


@pytest.mark.parametrize("call", [
    lambda em: em.prediction("m", score=_Explodes()),
    lambda em: em.prediction("m", probs=[0.5, _Explodes()]),
    lambda em: em.prediction("m", score=0.5, ts=_Explodes()),
    lambda em: em.outcome("r", _Explodes()),
    lambda em: em.prediction("m", score=0.5, id=_Explodes()),
])
def test_a_value_whose_conversion_raises_is_an_invalid_event(tmp_path, call):
    from calmon.client import Emitter
    em = Emitter.to_file(tmp_path / "e.jsonl")
    call(em)  # must not raise
    em.close()
    assert em.invalid_reasons() == {"bad_type": 1} and em.counters()["sent"] == 0
    strict = Emitter.to_file(tmp_path / "s.jsonl", strict=True)
    with pytest.raises(ValueError, match="bad_type"):
        call(strict)
    strict.close()
