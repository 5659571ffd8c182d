"""Internal-topic records are input too: every bad one is counted by reason, logged once, and skipped.

The ingest stage reads its states back, the evaluators read deltas and snapshots, and
any of those topics can hold a record that is not what a calmon worker wrote: a partial write, a
record from another release, a hand-made or forged one.  Such a record must never crash a worker
(a crash loop on the whole group: every new owner reads the same record) nor poison the
statistics, so each reader decodes at the seam -- the size first, then JSON, then the msgspec schema
with strict types (:mod:`calmon.state.checkpoint.schema`), then the fields' meaning -- and a record
that fails gets a :class:`BadRecord` with one of the bounded :data:`REASONS`.  :class:`BadRecords`
counts them per ``(topic kind, reason)`` (``calmon_cluster_bad_records_total``), logs the first
of each pair with its detail (a flood of garbage must not flood the log) and the caller skips the
record, falling back to the previous good one (states) or a replay (snapshots).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, TypeVar

from calmon.state.checkpoint.schema import SchemaError, convert

__all__ = ["REASONS", "KINDS", "MAX_RECORD", "BadRecord", "BadRecords", "decode_json", "decode_doc"]

log = logging.getLogger("calmon.cluster")

#: The internal topics a worker reads (the ``topic`` label).
KINDS = ("state", "delta", "snapshot")
#: Why a record was skipped (the ``reason`` label; bounded, so the metric's cardinality is too):
#:
#: * ``too_large``: over :data:`MAX_RECORD` bytes (no calmon writer produces it);
#: * ``not_json``: not UTF-8 JSON, or nested deeper than a parser follows;
#: * ``format``: JSON, but not a document of that topic (another format, a tombstone where a value belongs);
#: * ``version``: a version this calmon does not read;
#: * ``schema``: a field missing or of the wrong type (strict: ``"1"`` is no integer, ``true`` no number);
#: * ``invalid``: well typed but impossible (an empty range, a negative offset, a non-finite time);
#: * ``key_mismatch``: the record's key names another partition or model than its content;
#: * ``beyond_end``: a state past the end of its input partition (it would skip records never read);
#: * ``restore``: the document passed the schema but its state could not be rebuilt;
#: * ``too_many_models``: a delta or snapshot of a new model beyond ``limits.max_models`` (or undeclared
#:   while ``accept_unknown_models`` is off), as the ingest stage rejects events;
#: * ``unknown_segment``: a bucket of a segment the model is not configured with;
#: * ``incompatible``: classes, bins or grids that differ from the model's configuration.
REASONS = ("too_large", "not_json", "format", "version", "schema", "invalid", "key_mismatch", "beyond_end",
           "restore", "too_many_models", "unknown_segment", "incompatible")
#: The largest internal record read (the internal producer's ``max_request_size``: nothing larger was written
#: by a calmon worker); checked before parsing, so a huge record costs no memory beyond its bytes.
MAX_RECORD = 16 << 20

T = TypeVar("T")


class BadRecord(ValueError):
    """An internal-topic record that is skipped: ``reason`` one of :data:`REASONS`, the message says why."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown bad-record reason {reason!r}")
        super().__init__(detail)
        self.reason = reason


def decode_json(data: bytes | None, what: str, limit: int = MAX_RECORD) -> dict[str, Any]:
    """A record value parsed as one JSON object (``NaN``/``Infinity`` accepted: Python's ``json`` wrote them).

    Raises
    ------
    BadRecord
        ``too_large``, ``not_json`` or ``format`` (a tombstone, or JSON that is not an object).

    Examples
    --------
    >>> decode_json(b'{"a": 1}', "state")
    {'a': 1}
    >>> for bad in (b"\\xff", b"[1]", b"[" * 100000, None, b"x" * 20):
    ...     try:
    ...         decode_json(bad, "state", limit=16)
    ...     except BadRecord as exc:
    ...         print(exc.reason, "|", exc)
    not_json | state record is not JSON: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte
    format | state record is not a JSON object (list)
    too_large | state record of 100000 bytes, over the 16-byte limit
    format | state record has no value (a tombstone)
    too_large | state record of 20 bytes, over the 16-byte limit
    """
    if data is None:
        raise BadRecord("format", f"{what} record has no value (a tombstone)")
    if len(data) > limit:
        raise BadRecord("too_large", f"{what} record of {len(data)} bytes, over the {limit}-byte limit")
    try:
        doc = json.loads(data)
    except RecursionError:
        raise BadRecord("not_json", f"{what} record is nested too deeply") from None
    except ValueError as exc:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        raise BadRecord("not_json", f"{what} record is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRecord("format", f"{what} record is not a JSON object ({type(doc).__name__})")
    return doc


def decode_doc(doc: dict[str, Any], into: type[T], what: str, fmt: str, readable: tuple[int, ...]) -> T:
    """``doc`` checked as a ``fmt`` document of a ``readable`` version (absent: 1) and converted into ``into``.

    Raises
    ------
    BadRecord
        ``format``, ``version`` or ``schema`` (naming the field).
    """
    if doc.get("format") != fmt:
        raise BadRecord("format", f"{what} record is not a {fmt} document (format {str(doc.get('format'))[:40]!r})")
    version = doc.get("version", 1)
    if type(version) is not int or version not in readable:
        raise BadRecord("version", f"{what} record of version {str(version)[:20]!r} (this calmon reads "
                                   f"{', '.join(map(str, readable))})")
    try:
        return convert(doc, into)
    except SchemaError as exc:
        raise BadRecord("schema", f"{what} record: {exc}") from None


class BadRecords:
    """Skipped internal records per ``(kind, reason)``: counted, the first of each pair logged (thread-safe).

    Parameters
    ----------
    stage, worker
        Labels of the rendered series, and the log lines' prefix.

    Examples
    --------
    >>> bad = BadRecords("ingest", "w1")
    >>> bad.count("state", BadRecord("not_json", "state record is not JSON"), "events/0")
    >>> bad.count("state", BadRecord("not_json", "state record is not JSON"), "events/1")
    >>> bad.counts
    {('state', 'not_json'): 2}
    >>> print("\\n".join(bad.render()))  # doctest: +NORMALIZE_WHITESPACE
    # HELP calmon_cluster_bad_records_total Internal-topic records skipped, per topic and reason.
    # TYPE calmon_cluster_bad_records_total counter
    calmon_cluster_bad_records_total{stage="ingest",worker="w1",topic="state",reason="not_json"} 2
    """

    def __init__(self, stage: str, worker: str) -> None:
        self.stage, self.worker = stage, worker
        self.counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def count(self, kind: str, exc: BadRecord, where: str) -> None:
        """Count a skipped record of topic ``kind`` read at ``where``; log the first of its ``(kind, reason)``."""
        key = (kind, exc.reason)
        with self._lock:
            n = self.counts[key] = self.counts.get(key, 0) + 1
        if n == 1:
            log.warning("%s %s: skipping a bad %s record at %s (%s): %s; further ones are counted in "
                        "calmon_cluster_bad_records_total{topic=%r,reason=%r}", self.stage, self.worker, kind,
                        where[:200], exc.reason, str(exc)[:300], kind, exc.reason)

    def total(self, kind: str) -> int:
        """Records of topic ``kind`` skipped, every reason."""
        with self._lock:
            return sum(n for (k, _), n in self.counts.items() if k == kind)

    def render(self) -> list[str]:
        """The ``calmon_cluster_bad_records_total`` lines (topic and reason values are from a fixed set)."""
        with self._lock:
            counts = sorted(self.counts.items())
        base = f'stage="{self.stage}",worker="{self.worker}"'
        return ["# HELP calmon_cluster_bad_records_total Internal-topic records skipped, per topic and reason.",
                "# TYPE calmon_cluster_bad_records_total counter",
                *(f'calmon_cluster_bad_records_total{{{base},topic="{k}",reason="{r}"}} {n}'
                  for (k, r), n in counts)]
