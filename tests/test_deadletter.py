"""Dead-letter sink: line format, base64 for undecodable bytes, exactly-once truncation on restart."""

from __future__ import annotations

import base64
import json
import os
import random
from pathlib import Path

import pytest

from calmon.events.decoder import Decoder
from connectors.base import DeadLetterSink
from connectors.deadletter import FileDeadLetterSink
from connectors.files import FileSource


def read_lines(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines()]


def test_format_and_protocol(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "dead.jsonl"
    sink = FileDeadLetterSink(p)
    assert isinstance(sink, DeadLetterSink)
    raw = [b'{"score": 7}', b"\xff\x00\xfe", b'not "json"\n', "é".encode()]
    sink.write(raw, ["out_of_range", "not_json", "not_json", "not_json"], "files", ["a:1", "a:2", "a:3", "a:4"])
    sink.write([b"x"], ["not_json"], "kafka")  # no origins
    sink.write([], [], "files")
    sink.flush()
    rows = read_lines(p)
    assert [r["reason"] for r in rows] == ["out_of_range", "not_json", "not_json", "not_json", "not_json"]
    assert rows[0] == {"reason": "out_of_range", "source": "files", "origin": "a:1", "record": '{"score": 7}'}
    assert rows[1]["record_encoding"] == "base64" and base64.b64decode(rows[1]["record"]) == raw[1]
    assert rows[2]["record"] == 'not "json"\n' and "record_encoding" not in rows[2]
    assert rows[3]["record"] == "é"
    assert rows[4]["origin"] is None and rows[4]["source"] == "kafka"
    assert len(p.read_bytes().splitlines()) == 5  # embedded newlines are escaped: one line per record
    sink.close()
    sink.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        sink.write([b"x"], ["not_json"], "files")


def test_validation(tmp_path: Path) -> None:
    sink = FileDeadLetterSink(tmp_path / "d.jsonl")
    with pytest.raises(ValueError, match="reasons"):
        sink.write([b"a", b"b"], ["not_json"], "s")
    with pytest.raises(ValueError, match="origins"):
        sink.write([b"a"], ["not_json"], "s", ["o1", "o2"])
    with pytest.raises(ValueError, match="not a dead-letter position"):
        sink.seek({"offset": 3})
    with pytest.raises(ValueError, match="buffer_bytes"):
        FileDeadLetterSink(tmp_path / "e.jsonl", buffer_bytes=-1)


def test_position_is_size_after_flush_and_seek_truncates(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    sink = FileDeadLetterSink(p, buffer_bytes=1 << 30)
    sink.write([b"a"], ["not_json"], "s")
    assert p.stat().st_size == 0  # buffered
    pos = sink.position()
    assert pos["size"] == p.stat().st_size > 0
    assert json.loads(json.dumps(pos)) == pos
    sink.write([b"b", b"c"], ["not_json"] * 2, "s")
    sink.flush()
    sink.write([b"d"], ["not_json"], "s")  # still buffered: dropped by seek
    sink.seek(pos)
    sink.flush()
    assert [r["record"] for r in read_lines(p)] == ["a"]
    sink.write([b"e"], ["not_json"], "s")
    sink.close()
    assert [r["record"] for r in read_lines(p)] == ["a", "e"]


def test_seek_does_not_truncate_another_file(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    sink = FileDeadLetterSink(p)
    sink.write([b"a"], ["not_json"], "s")
    pos = sink.position()
    sink.close()
    os.rename(p, tmp_path / "d.jsonl.1")  # rotated by hand; a new file gets written
    sink = FileDeadLetterSink(p)
    sink.write([b"b" * 100], ["not_json"], "s")
    sink.flush()
    size = p.stat().st_size
    sink.seek(pos)
    assert p.stat().st_size == size
    sink.close()


def test_exactly_once_across_simulated_crashes(tmp_path: Path) -> None:
    """Reject records in batches, checkpoint at random moments, crash (dropping the buffer) and restart
    from the checkpoint: the dead-letter file equals that of an uninterrupted run."""
    rng = random.Random(3)
    batches = [[f"bad-{i}-{j}".encode() for j in range(rng.randint(0, 5))] for i in range(300)]

    def run(path: Path, crashes: bool) -> None:
        sink = FileDeadLetterSink(path, buffer_bytes=rng.choice([0, 64, 1 << 20]))
        ckpt = {"next": 0, "dl": sink.position()}
        i = 0
        while i < len(batches):
            b = batches[i]
            sink.write(b, ["not_json"] * len(b), "s", [f"f:{i}"] * len(b))
            i += 1
            if rng.random() < 0.2:
                ckpt = {"next": i, "dl": sink.position()}
            if crashes and rng.random() < 0.05:
                if rng.random() < 0.5:
                    sink.flush()  # some lines after the checkpoint made it to the file
                os.close(sink._fd)  # crash: no flush of what is still buffered
                sink._fd = None
                sink = FileDeadLetterSink(path)
                sink.seek(json.loads(json.dumps(ckpt["dl"])))
                i = ckpt["next"]
        sink.close()

    run(tmp_path / "clean.jsonl", crashes=False)
    run(tmp_path / "crashy.jsonl", crashes=True)
    assert (tmp_path / "crashy.jsonl").read_bytes() == (tmp_path / "clean.jsonl").read_bytes()


def test_with_source_and_decoder(tmp_path: Path) -> None:
    """Malformed lines from a file are dead-lettered with the decoder's reason and the line's origin."""
    p = tmp_path / "in.jsonl"
    good = '{"model":"m","score":0.4,"label":1}'
    lines = [good, "{oops", '{"model":"m","score":2,"label":1}', "[1]", good, '{"model":"m","label":1,"score":"x"}']
    p.write_text("\n".join(lines) + "\n")
    src = FileSource(p, name="in")
    b = src.read()
    dec = Decoder().decode(b.records, b.origins)
    sink = FileDeadLetterSink(tmp_path / "dead.jsonl")
    rej = dec.rejected
    sink.write([b.records[r.index] for r in rej], [r.reason for r in rej], b.source, [b.origins[r.index] for r in rej])
    sink.close()
    rows = read_lines(tmp_path / "dead.jsonl")
    assert [(r["origin"].rsplit(":", 1)[1], r["reason"]) for r in rows] == [
        ("2", "not_json"), ("3", "out_of_range"), ("4", "not_object"), ("6", "bad_type")]
    assert [r["record"] for r in rows] == [lines[1], lines[2], lines[3], lines[5]]
    assert all(r["source"] == "in" for r in rows)
    assert len(dec.models["m"]) == 2


def test_killed_before_first_checkpoint_restarts_from_baseline(tmp_path: Path) -> None:
    """A run that flushed dead letters but died before its first periodic checkpoint: the next run
    restores the baseline checkpointed at the fresh start and truncates them instead of appending."""
    from calmon.state.checkpoint.store import CheckpointStore
    p = tmp_path / "dead.jsonl"
    store = CheckpointStore(tmp_path / "state")

    def start() -> FileDeadLetterSink:
        sink = FileDeadLetterSink(p, buffer_bytes=0)
        doc = store.load()
        if doc is None:
            store.save({"dl": sink.position()})  # the baseline, before anything is written
        else:
            sink.seek(doc["dl"])
        return sink

    sink = start()
    sink.write([b"a", b"b"], ["not_json"] * 2, "s")  # flushed (buffer_bytes=0), never checkpointed
    os.close(sink._fd)  # killed
    sink._fd = None
    sink = start()
    sink.write([b"a", b"b"], ["not_json"] * 2, "s")
    sink.close()
    assert [r["record"] for r in read_lines(p)] == ["a", "b"]


def test_huge_records_keep_a_bounded_prefix_size_and_hash(tmp_path):
    """A 5 MB record (or a line the file source skipped) becomes a bounded dead letter (issue #14)."""
    import hashlib

    from calmon.events.decoder import OversizedRecord
    p = tmp_path / "dead.jsonl"
    sink = FileDeadLetterSink(p, max_record_bytes=1000)
    huge = b'{"id":"' + b"a" * (5 << 20) + b'"}'
    skipped = OversizedRecord(b"z" * 10_000, 200 << 20, "f" * 64)
    sink.write([huge, skipped, b'{"score": 2}', "\ud800"], ["too_large", "too_large", "out_of_range", "bad_encoding"],
               "files", ["a:1", "a:2", "a:3", "a:4"])
    sink.close()
    assert p.stat().st_size < 10_000
    docs = [json.loads(x) for x in p.read_text().splitlines()]
    assert docs[0]["record"] == huge[:1000].decode() and docs[0]["size"] == len(huge)
    assert docs[0]["sha256"] == hashlib.sha256(huge).hexdigest() and docs[0]["truncated"] is True
    assert docs[1]["record"] == "z" * 1000 and docs[1]["size"] == 200 << 20 and docs[1]["sha256"] == "f" * 64
    assert docs[2] == {"reason": "out_of_range", "source": "files", "origin": "a:3", "record": '{"score": 2}'}
    assert docs[3]["record_encoding"] == "base64"


def test_kafka_key_and_headers_are_kept(tmp_path: Path) -> None:
    from connectors.base import RecordMeta
    p = tmp_path / "dead.jsonl"
    sink = FileDeadLetterSink(p)
    meta = [RecordMeta(1_700_000_000_000, b"id-\xff", (("model", b"fraud"), ("model", b"x"))), RecordMeta()]
    sink.write([b"{", b"}"], ["not_json", "not_json"], "kafka", ["t/0@1", "t/0@2"], meta)
    sink.flush()
    rows = read_lines(p)
    assert base64.b64decode(rows[0]["key_b64"]) == b"id-\xff"
    assert [(n, base64.b64decode(v)) for n, v in rows[0]["headers"]] == [("model", b"fraud"), ("model", b"x")]
    assert "key_b64" not in rows[1] and "headers" not in rows[1]  # a record without metadata gets no fields
    sink.close()
