"""Every shell and Python example of README.md and docs/ runs (issue #34.4).

Fenced blocks tagged ``bash``, ``sh``, ``shell``, ``console`` (the ``$ `` lines) or ``python`` are executed, the blocks
of one page in order in one temporary directory, so a block may use the files an earlier one wrote. The directory
holds small inputs the examples name (``predictions.jsonl`` and ``outcomes.jsonl`` of a foreign shape,
``events.jsonl`` in calmon's schema, 2000 predictions each) and links to the repository's ``config/``, ``deploy/``
and ``docs/``; its parent holds ``shared`` (the papers' data), so ``../shared/...`` works as from a checkout.

A block that needs a broker, a server, an installation or a run without end is preceded by
``<!-- skip-test reason="..." -->``: it is counted (and their number kept small), never silently ignored. Blocks in
other languages (``text``, ``json``, ``yaml``) are shown, not run; synopses with ``[OPTIONS]`` are written as
``text``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
RUN = {"bash": "bash", "sh": "bash", "shell": "bash", "console": "console", "python": "python", "py": "python"}
SKIP = re.compile(r'<!--\s*skip-test\s+reason="([^"]+)"\s*-->')
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)(.*)$")
#: Most blocks that may be skipped; a new one needs a reason and room here.
MAX_SKIPPED = 20
#: One block's wall-clock bound: generous, as the 2-core CI machine is shared (a block takes 1-10 s of CPU).
BLOCK_TIMEOUT = 600


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    kind: str  # bash | console | python
    code: str
    skip: str | None  # the reason, for a skipped block


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def parse(text: str, page: str) -> list[Block]:
    """The runnable (and the explicitly skipped) fenced blocks of a Markdown text."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(2), m.group(3).lower()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        indent = len(m.group(1))
        code = "\n".join(ln[indent:] for ln in lines[i + 1:j])
        if lang in RUN:
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            sm = SKIP.search(lines[k]) if k >= 0 else None
            blocks.append(Block(page, i + 1, RUN[lang], code, sm.group(1) if sm else None))
        i = j + 1
    return blocks


def console_commands(code: str) -> str:
    """The commands of a console transcript (``$ `` lines, ``\\`` continuations), as a script."""
    out: list[str] = []
    cont = False
    for ln in code.splitlines():
        if ln.startswith("$ ") or cont:
            cmd = ln[2:] if ln.startswith("$ ") and not cont else ln
            out.append(cmd)
            cont = cmd.rstrip().endswith("\\")
    return "\n".join(out)


def _own_shape_inputs(work: Path) -> None:
    """predictions.jsonl + outcomes.jsonl of a foreign shape and events.jsonl, as the README's walk-through shows."""
    from connectors.simulation import SimulationSpec, Simulator

    sim = Simulator(SimulationSpec(classes=2, model="sim", seed=0, miscalibration="temperature:0.7", delay=30.0))
    raw = list(sim.stream(2000))
    (work / "events.jsonl").write_bytes(b"\n".join(raw) + b"\n")
    with open(work / "predictions.jsonl", "w") as pred, open(work / "outcomes.jsonl", "w") as out:
        for line in raw:
            e = json.loads(line)
            if e["type"] == "prediction":
                pred.write(json.dumps({"request_id": e["id"], "model_name": "fraud", "p_fraud": round(e["score"], 4),
                                       "ts_ms": int(e["ts"] * 1000)}) + "\n")
            else:
                out.write(json.dumps({"request_id": e["id"], "is_fraud": "yes" if e["label"] else "no",
                                      "ts_ms": int(e["ts"] * 1000)}) + "\n")


def workspace(tmp: Path) -> Path:
    work = tmp / "work"
    work.mkdir()
    if SHARED.exists():
        (tmp / "shared").symlink_to(SHARED)
    for name in ("config", "deploy", "docs"):
        (work / name).symlink_to(ROOT / name)
    _own_shape_inputs(work)
    return work


def run_block(block: Block, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "COLUMNS": "120", "OPENBLAS_NUM_THREADS": "1"}
    if block.kind == "python":
        script = cwd / f"_block_{block.line}.py"
        script.write_text(block.code + "\n")
        argv = [sys.executable, str(script)]
    else:
        code = console_commands(block.code) if block.kind == "console" else block.code
        argv = ["bash", "-euo", "pipefail", "-c", code]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT,
                          stdin=subprocess.DEVNULL)


def check_page(blocks: list[Block], tmp: Path) -> None:
    work = workspace(tmp)
    for b in blocks:
        if b.skip:
            continue
        r = run_block(b, work)
        assert r.returncode == 0, (f"{b.page}:{b.line}: the {b.kind} example failed (exit {r.returncode})\n"
                                   f"--- code\n{b.code}\n--- stdout\n{r.stdout[-3000:]}\n"
                                   f"--- stderr\n{r.stderr[-3000:]}")


ALL = {str(p.relative_to(ROOT)): parse(p.read_text(), str(p.relative_to(ROOT))) for p in pages()}
RUNNABLE = sorted(name for name, blocks in ALL.items() if any(not b.skip for b in blocks))


@pytest.mark.parametrize("page", RUNNABLE)
def test_examples_of_the_page_run(page: str, tmp_path: Path) -> None:
    check_page(ALL[page], tmp_path)


def test_skipped_examples_are_few_and_say_why() -> None:
    skipped = [b for blocks in ALL.values() for b in blocks if b.skip]
    total = sum(len(blocks) for blocks in ALL.values())
    print(f"{total} runnable examples, {len(skipped)} skipped:")
    for b in skipped:
        print(f"  {b.page}:{b.line}: {b.skip}")
    assert all(b.skip.strip() for b in skipped)
    assert len(skipped) <= MAX_SKIPPED, f"{len(skipped)} skipped examples (at most {MAX_SKIPPED})"
    assert total - len(skipped) >= 10, "the runner found almost no example: is the parser broken?"


def test_the_runner_fails_a_broken_example_and_honours_skip(tmp_path: Path) -> None:
    text = ("Intro\n\n```bash\necho ok > made.txt\n```\n\n<!-- skip-test reason=\"needs Kafka\" -->\n```bash\n"
            "exit 7\n```\n\n```console\n$ test -f made.txt && \\\n  echo continued\nnot a command\n```\n\n"
            "```python\nraise SystemExit(open('made.txt').read().strip() == 'ok' and 3)\n```\n\n```text\nexit 9\n```\n")
    blocks = parse(text, "fake.md")
    assert [(b.kind, b.skip) for b in blocks] == [("bash", None), ("bash", "needs Kafka"), ("console", None),
                                                  ("python", None)]
    assert console_commands(blocks[2].code) == "test -f made.txt && \\\n  echo continued"
    with pytest.raises(AssertionError, match=r"fake.md:18: the python example failed \(exit 3\)"):
        check_page(blocks, tmp_path)
