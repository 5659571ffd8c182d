"""Replay JSONL files through the agent with two code trees and compare the resulting state and dead letters.

A change meant to leave ingestion's results alone (issue #15: the decoder's fast paths, lazy file origins, the
batch fold's sorts) must give the same state document (every ring's buckets, join buffers, counters, the
decoder's admitted models and segments) and the same dead-letter file, byte for byte. Each tree runs in a
fresh process whose ``PYTHONPATH`` starts with the tree (evaluation every hour, so never during the replay) and
prints a digest; the script reports whether they agree::

    git archive HEAD calmon connectors | tar -x -C /tmp/base
    python -m benchmarks.compare_agent_state --baseline /tmp/base FILE.jsonl [FILE.jsonl ...]

Exit status 0 when every file gives the same digests, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks._child import last_json, run_module

#: The agent's wall clock (epoch seconds): after the benchmark's generated events (2026-01-01 plus 2 days).
CLOCK = 1_767_400_000.0


def child(path: str) -> None:
    """Replay ``path`` with the packages this process imports; print the digests as one JSON line."""
    import calmon
    from calmon.agent.runtime import Agent
    from calmon.config import build_config
    work = Path(tempfile.mkdtemp(prefix="calmon-compare-"))
    dead = work / "dead.jsonl"
    cfg = build_config({
        "state_dir": str(work / "state"), "sources": [{"name": "replay", "path": path}],
        "models": {"default": {"bins": 1024, "reservoir": 256, "segments": ["web", "app"]}},
        "evaluation": {"every": "1h"}, "dead_letter": {"path": str(dead)}, "exporter": {"enabled": False},
        "checkpoint": {"every": "1h"}, "ingest": {"exit_when_done": True},
    }, env={})
    agent = Agent(cfg, clock=lambda: CLOCK)  # a fixed wall clock: events without ts get the same arrival time
    agent.open()
    while agent.poll_once():
        pass
    state = json.dumps(agent.state.to_doc(), sort_keys=True, default=str).encode()
    agent.close()
    letters = dead.read_bytes() if dead.exists() else b""
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"code": calmon.__file__, "state": hashlib.sha256(state).hexdigest(),
                      "dead_letters": hashlib.sha256(letters).hexdigest(), "dead_count": letters.count(b"\n")}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="JSONL files of events")
    ap.add_argument("--baseline", required=True, help="a tree with another version's calmon and connectors")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.files[0])
        return 0
    same = True
    for path in args.files:
        got = []
        for code in (args.baseline, None):  # None: the packages this process imports
            out = run_module("benchmarks.compare_agent_state", "--baseline", args.baseline, "--child", path,
                             code=code, check=False)
            if out.returncode:
                print(out.stderr, file=sys.stderr)
                return 1
            got.append(last_json(out.stdout))
        agree = all(got[0][k] == got[1][k] for k in ("state", "dead_letters", "dead_count"))
        same &= agree
        print(f"{path}: {'same' if agree else 'DIFFERENT'} state {got[1]['state'][:16]} / {got[0]['state'][:16]}, "
              f"dead letters {got[1]['dead_count']} {got[1]['dead_letters'][:16]} / {got[0]['dead_letters'][:16]}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
