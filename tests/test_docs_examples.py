"""Every shell and Python example of README.md and docs/ runs (issue #34.4): the README.

The runner is ``tests/docs_examples.py``; the other page groups are ``tests/test_docs_examples_{pages,guide,depth}.py``
(a module per group, so the suite's xdist workers share the pages).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docs_examples import (  # noqa: E402
    ALL,
    GROUPS,
    MAX_SKIPPED,
    RUNNABLE,
    check_page,
    console_commands,
    group_of,
    needs_kafka,
    parse,
    runnable,
)


@pytest.mark.parametrize("page", runnable("start"))
def test_examples_of_the_page_run(page: str, tmp_path: Path) -> None:
    check_page(ALL[page], tmp_path)


def test_every_page_is_in_one_group() -> None:
    assert {group_of(p) for p in RUNNABLE} == set(GROUPS), "a page group has no page: drop it or its module"
    assert sorted(p for g in GROUPS for p in runnable(g)) == RUNNABLE
    for group in GROUPS:
        assert Path(__file__).with_name("test_docs_examples.py" if group == "start"
                                        else f"test_docs_examples_{group}.py").exists(), group


def test_skipped_examples_are_few_and_say_why() -> None:
    skipped = [b for blocks in ALL.values() for b in blocks if b.skip]
    total = sum(len(blocks) for blocks in ALL.values())
    print(f"{total} examples, {len(skipped)} skipped:")
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


def test_a_page_naming_the_broker_variable_gets_a_broker(tmp_path: Path) -> None:
    text = ("```python\nimport os\nfrom kafka import KafkaAdminClient\n"
            "KafkaAdminClient(bootstrap_servers=os.environ['KAFKA_BOOTSTRAP']).close()\n```\n")
    blocks = parse(text, "fake.md")
    assert needs_kafka(blocks) and not needs_kafka(parse(text.replace("KAFKA_BOOTSTRAP", "X"), "fake.md"))
    check_page(blocks, tmp_path)
