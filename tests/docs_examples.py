"""The runner behind ``tests/test_docs_examples*.py``: every shell and Python example of README.md and docs/ runs
(issue #34.4).

Fenced blocks tagged ``bash``, ``sh``, ``shell``, ``console`` (the ``$ `` lines) or ``python`` are executed, the blocks
of one page in order in one temporary directory, so a block may use the files an earlier one wrote. The directory
holds small inputs the examples name (``predictions.jsonl`` and ``outcomes.jsonl`` of a foreign shape,
``events.jsonl`` in calmon's schema, 2000 predictions each) and links to the repository's ``config/``, ``deploy/``
and ``docs/``; its parent holds ``shared`` (the papers' data), so ``../shared/...`` works as from a checkout.

A page whose runnable blocks name ``KAFKA_BOOTSTRAP`` runs against a real Kafka-protocol broker (Tansu, as the Kafka
integration tests start it), whose address the blocks get in that environment variable.

A block that needs an installation, Docker, a cluster, a service manager or a run without end is preceded by
``<!-- skip-test reason="..." -->``: it is counted (and their number kept small), never silently ignored. Blocks in
other languages (``text``, ``json``, ``yaml``) are shown, not run; synopses with ``[OPTIONS]`` are written as
``text``.

The pages are split into groups (:func:`group_of`), one test module each, so that the three xdist workers of the
suite (``--dist loadfile``: a module per worker) share them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kafka_broker import KafkaBroker, require_broker  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
RUN = {"bash": "bash", "sh": "bash", "shell": "bash", "console": "console", "python": "python", "py": "python"}
SKIP = re.compile(r'<!--\s*skip-test\s+reason="([^"]+)"\s*-->')
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)(.*)$")
#: Most blocks that may be skipped; a new one needs a reason and room here.
MAX_SKIPPED = 15
#: A page whose runnable blocks contain this gets a broker, its address in this environment variable.
KAFKA_VAR = "KAFKA_BOOTSTRAP"
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


def run_block(block: Block, cwd: Path, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "COLUMNS": "120", "OPENBLAS_NUM_THREADS": "1", **(extra_env or {})}
    if block.kind == "python":
        script = cwd / f"_block_{block.line}.py"
        script.write_text(block.code + "\n")
        argv = [sys.executable, str(script)]
    else:
        code = console_commands(block.code) if block.kind == "console" else block.code
        argv = ["bash", "-euo", "pipefail", "-c", code]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT,
                          stdin=subprocess.DEVNULL)


def needs_kafka(blocks: list[Block]) -> bool:
    return any(KAFKA_VAR in b.code for b in blocks if not b.skip)


def check_page(blocks: list[Block], tmp: Path) -> None:
    work = workspace(tmp)
    if not needs_kafka(blocks):
        _run_all(blocks, work, {})
        return
    require_broker()
    with KafkaBroker() as broker:
        _run_all(blocks, work, {KAFKA_VAR: broker.bootstrap})


def _run_all(blocks: list[Block], work: Path, env: dict[str, str]) -> None:
    for b in blocks:
        if b.skip:
            continue
        r = run_block(b, work, env)
        assert r.returncode == 0, (f"{b.page}:{b.line}: the {b.kind} example failed (exit {r.returncode})\n"
                                   f"--- code\n{b.code}\n--- stdout\n{r.stdout[-3000:]}\n"
                                   f"--- stderr\n{r.stderr[-3000:]}")


#: Page groups, a test module each (group -> predicate on the page's path); measured times balance them.
GROUPS = {
    "start": lambda page: page == "README.md",  # the slowest page (the whole walk-through): a module of its own
    "pages": lambda page: page in {f"docs/{name}.md" for name in (
        "index", "getting-started", "install", "api", "schemas", "report", "development")},
    "guide": lambda page: page.startswith("docs/guide/"),
    "depth": lambda page: True,  # every other page: the in-depth pages, concepts, statistics, reference, ...
}


def group_of(page: str) -> str:
    """The first group whose predicate holds (``depth`` takes the rest)."""
    return next(name for name, pred in GROUPS.items() if pred(page))


ALL = {str(p.relative_to(ROOT)): parse(p.read_text(), str(p.relative_to(ROOT))) for p in pages()}
RUNNABLE = sorted(name for name, blocks in ALL.items() if any(not b.skip for b in blocks))


def runnable(group: str) -> list[str]:
    """The pages of a group with at least one block to run."""
    return [page for page in RUNNABLE if group_of(page) == group]
