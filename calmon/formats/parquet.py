"""Parquet and Arrow IPC files as JSON records for :class:`calmon.events.decoder.Decoder`, batch by batch.

A table file is read one record batch at a time (Parquet: ``ParquetFile.iter_batches`` within row groups;
Arrow IPC: one stored batch at a time from a memory map) and only the columns that are needed: the
mapping's :attr:`calmon.events.schema.Mapping.columns`, or without a mapping the canonical columns present.
Each row becomes one JSON object (:func:`batch_records`), so Parquet rows go through the same decoder,
reason codes and dead letters as JSON Lines: a rejected row's dead-letter bytes are its JSON object.

Rows in JSON
------------
* A struct column is a nested object (dotted mapping paths reach into it), a list column a list
  (``probs``), a map column an object (``{class name: probability}``); null cells are left out.
* Timestamp columns become RFC 3339 strings in UTC (a timestamp without time zone is taken as UTC);
  decimals become floats; dictionary-encoded strings their values.
* Without a mapping the column names follow the CSV layout (:mod:`calmon.formats.csvrows`): ``score,label``,
  ``confidence,correct`` (top-label), ``p0..p{K-1},label`` (gathered into ``probs``) or a list column
  ``probs``, with optional ``id, model, type, segment, ts``; boolean columns become 0/1. A file without
  a ``model`` column gets the constant model given by the caller (``calmon check``) or none (the agent
  then rejects its rows as ``missing_field``, as it does CSV rows without a model).

A Parquet or Arrow IPC file whose footer is missing (still being written, or cut short) raises
:class:`IncompleteTable` at open, which the file source takes as "not complete yet"; a file named like Parquet
that does not begin with ``PAR1`` (a writer writes it first) raises :class:`NotATable` instead: it will not
become one.

Examples
--------
>>> import pyarrow as pa
>>> b = pa.record_batch({"p": [0.25, None], "meta": [{"model": "m"}, {"model": "m"}], "y": [True, False]})
>>> batch_records(b, mapped_plan(b.schema.names, frozenset({"p", "meta", "y"})))
[b'{"p":0.25,"meta":{"model":"m"},"y":true}', b'{"meta":{"model":"m"},"y":false}']
>>> b = pa.record_batch({"p0": [0.2], "p1": [0.3], "p2": [0.5], "label": [2], "extra": ["x"]})
>>> plan = canonical_plan(b.schema.names, default_model="m")
>>> plan.read, batch_records(b, plan)
(('label', 'p0', 'p1', 'p2'), [b'{"label":2,"probs":[0.2,0.3,0.5],"model":"m"}'])
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import msgspec
import numpy as np

from calmon.formats.csvrows import CsvLayout
from calmon.formats.extras import MissingExtra, missing_message, require

__all__ = ["TableError", "IncompleteTable", "NotATable", "NoTableLibrary", "TableFile", "RowPlan", "canonical_plan",
           "mapped_plan", "batch_records", "table_kind", "TABLE_SUFFIXES"]

PARQUET_MAGIC = b"PAR1"
ARROW_MAGIC = b"ARROW1"
TABLE_SUFFIXES = (".parquet", ".pq", ".arrow", ".feather", ".ipc")
_CANONICAL = ("type", "id", "model", "ts", "segment", "score", "probs", "label")
_ENCODER = msgspec.json.Encoder()


class TableError(ValueError):
    """A table file that cannot be read (one line: why)."""


class IncompleteTable(TableError):
    """A Parquet or Arrow IPC file without its footer: still being written (or cut short)."""


class NotATable(TableError):
    """A file read as Parquet that is something else (it does not begin with ``PAR1``)."""


class NoTableLibrary(TableError, MissingExtra):
    """pyarrow, which reads Parquet and Arrow files, is not installed (the ``parquet`` extra).

    A :class:`TableError` too, so the file source skips such a file with this reason instead of failing,
    and ``calmon check`` stops with its one line.
    """


def _pyarrow(kind: str) -> Any:
    """``pyarrow``, or :class:`NoTableLibrary` naming the extra (pyarrow is 170 MB: not in the base install)."""
    feature = f"reading .{kind}"
    try:
        return require("pyarrow", extra="parquet", feature=feature)
    except MissingExtra as exc:
        raise NoTableLibrary(missing_message("pyarrow", "parquet", feature)) from exc


def table_kind(head: bytes, path: str = "") -> str | None:
    """``"parquet"``, ``"arrow"`` or ``None`` from a file's first bytes (or, for an empty head, its name).

    >>> table_kind(b"PAR1\\x15"), table_kind(b"ARROW1\\x00\\x00"), table_kind(b"", "x.parquet"), table_kind(b"{")
    ('parquet', 'arrow', 'parquet', None)
    """
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    if head.startswith(ARROW_MAGIC):
        return "arrow"
    low = path.lower()
    if not head and low.endswith((".parquet", ".pq")):
        return "parquet"
    if low.endswith((".arrow", ".feather", ".ipc")) and head[:4] == b"\xff\xff\xff\xff":
        return "arrow"  # the IPC stream format (no file footer)
    return None


@dataclass(frozen=True)
class RowPlan:
    """Which columns are read and under which keys a row becomes a JSON object.

    Attributes
    ----------
    read
        The top-level columns read from the file.
    keys
        The JSON key of each of the first ``len(keys)`` columns of ``read``.
    probs
        Columns ``p0..p{K-1}`` (the rest of ``read``) gathered into a ``probs`` list.
    const
        Fields every row gets (``model`` when the file has none and the caller gave one).
    bool_as_int
        Boolean cells become 0/1 (the canonical schema's labels are numbers).
    top_label
        The score column is named ``confidence`` (top-label confidence and correctness).
    """

    read: tuple[str, ...]
    keys: tuple[str, ...]
    probs: tuple[str, ...] = ()
    const: tuple[tuple[str, str], ...] = ()
    bool_as_int: bool = False
    top_label: bool = False


def mapped_plan(names: Sequence[str], columns: frozenset[str] | None) -> RowPlan:
    """Rows in the user's shape for a schema mapping: the columns it reads (``None``: all) that exist."""
    read = tuple(n for n in names if columns is None or n in columns)
    return RowPlan(read, read)


def canonical_plan(names: Sequence[str], default_model: str | None = None) -> RowPlan:
    """Rows in the canonical schema from columns named like a CSV header (see the module docstring).

    Raises :class:`TableError` when no usable layout is found.
    """
    lower = [n.strip().lower() for n in names]
    if "probs" in lower:  # a list column: the canonical name itself
        keep = [(n, low) for n, low in zip(names, lower) if low in _CANONICAL]
        return _with_model(RowPlan(tuple(n for n, _ in keep), tuple(low for _, low in keep), bool_as_int=True),
                           default_model)
    layout = CsvLayout.from_names(list(names))
    if layout.error is not None:
        raise TableError(f"columns {', '.join(names)[:120]}: {layout.error} (expected score,label | "
                         "probs,label | p0..p{K-1},label | confidence,correct, or give a schema mapping)")
    fields = sorted(layout.fields)
    plan = RowPlan(tuple(names[i] for i, _, _ in fields) + tuple(names[i] for i in layout.probs),
                   tuple(k for _, k, _ in fields), tuple(names[i] for i in layout.probs), bool_as_int=True,
                   top_label=layout.top_label)
    return _with_model(plan, default_model)


def _with_model(plan: RowPlan, default_model: str | None) -> RowPlan:
    if default_model is None or "model" in plan.keys:
        return plan
    return RowPlan(plan.read, plan.keys, plan.probs, (("model", default_model),), plan.bool_as_int, plan.top_label)


def batch_records(batch: Any, plan: RowPlan) -> list[bytes]:
    """The rows of a ``pyarrow.RecordBatch`` as JSON objects (bytes), following ``plan``."""
    n = batch.num_rows
    keys = list(plan.keys)
    columns = [batch.column(name) for name in plan.read[:len(keys)]]
    nulls = any(c.null_count for c in columns)
    lists = [_cells(c, plan.bool_as_int) for c in columns]
    if plan.probs:
        cols = [batch.column(c).to_numpy(zero_copy_only=False) for c in plan.probs]
        lists.append(np.column_stack([np.asarray(c, dtype=np.float64) for c in cols]).tolist())
        keys.append("probs")
    const = dict(plan.const)
    encode = _ENCODER.encode
    if not lists:
        return [encode(const)] * n
    if not nulls and not const:  # the common case: no cell to leave out
        return [encode(dict(zip(keys, vals))) for vals in zip(*lists)]
    out: list[bytes] = []
    append = out.append
    for vals in zip(*lists):
        row = {k: v for k, v in zip(keys, vals) if v is not None}
        if const:
            row.update(const)
        append(encode(row))
    return out


def _cells(arr: Any, bool_as_int: bool) -> list[Any]:
    """One column as Python values, with the types JSON and the decoder understand (module docstring)."""
    import pyarrow as pa

    target = _json_type(arr.type, bool_as_int)
    if target is not None:
        arr = arr.cast(target)
    values: list[Any] = arr.to_pylist()
    if pa.types.is_map(arr.type):
        return [None if v is None else dict(v) for v in values]
    return values


def _json_type(t: Any, bool_as_int: bool) -> Any:
    """The type to cast a column to before ``to_pylist`` (``None``: keep it), recursively."""
    import pyarrow as pa

    if pa.types.is_timestamp(t):
        return None if t.tz is not None else pa.timestamp(t.unit, "UTC")
    if pa.types.is_decimal(t):
        return pa.float64()
    if pa.types.is_dictionary(t):
        return _json_type(t.value_type, bool_as_int) or t.value_type
    if bool_as_int and pa.types.is_boolean(t):
        return pa.int8()
    if pa.types.is_struct(t):
        kids = [t.field(i) for i in range(t.num_fields)]
        new = [_json_type(f.type, False) for f in kids]
        if all(x is None for x in new):
            return None
        return pa.struct([f.with_type(x) if x is not None else f for f, x in zip(kids, new)])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = _json_type(t.value_type, False)
        return None if inner is None else (pa.list_ if pa.types.is_list(t) else pa.large_list)(inner)
    return None


class TableFile:
    """One Parquet or Arrow IPC file (a path, or the bytes of standard input), read batch by batch.

    Parameters
    ----------
    source
        A file path, the whole file as bytes, or a seekable binary file object (closed by :meth:`close`).
    kind
        ``"parquet"`` or ``"arrow"`` (see :func:`table_kind`).

    Raises
    ------
    IncompleteTable
        A Parquet or Arrow IPC file without footer.
    NotATable
        A "Parquet" file that does not begin with ``PAR1``.
    TableError
        Any other unreadable file.
    """

    def __init__(self, source: str | bytes | BinaryIO, kind: str) -> None:
        pa = _pyarrow(kind)  # every read of a table starts here: the one place a missing pyarrow is reported
        if kind == "parquet":
            head = _head(source)
            if head[:4] != PARQUET_MAGIC[:len(head)]:
                raise NotATable(f"not a Parquet file: it begins with {head!r}, not {PARQUET_MAGIC!r}")
        self.kind = kind
        self._src = pa.BufferReader(source) if isinstance(source, bytes) else source
        self._fileobj = None if isinstance(source, (str, bytes)) else source
        self._pf: Any = None
        self._ipc: Any = None
        try:
            if kind == "parquet":
                import pyarrow.parquet as pq

                self._pf = pq.ParquetFile(self._src)
                self.names: list[str] = list(self._pf.schema_arrow.names)
                self.num_rows: int = int(self._pf.metadata.num_rows)
            else:
                self._ipc = _open_ipc(source)
                self.names = list(self._ipc.schema.names)
                self.num_rows = -1  # unknown without reading the batches' headers
        except (pa.ArrowInvalid, OSError) as exc:
            if kind == "parquet" and ("footer" in str(exc) or "size is 0" in str(exc)):
                raise IncompleteTable("no Parquet footer: still being written, cut short, or not Parquet") from None
            raise TableError(f"not a readable {kind} file: {str(exc)[:160]}") from None

    def batches(self, columns: Iterable[str], start: int = 0, rows: int = 65536) -> Iterator[Any]:
        """Record batches of ``columns`` from row ``start`` (at most ``rows`` rows each)."""
        import pyarrow as pa

        cols = list(columns)
        try:
            if self._pf is not None:
                yield from _parquet_batches(self._pf, cols, start, rows)
            else:
                yield from _ipc_batches(self._ipc, cols, start)
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
            raise TableError(f"unreadable {self.kind} data: {str(exc)[:160]}") from None

    def close(self) -> None:
        if self._pf is not None:
            self._pf.close()
        if self._fileobj is not None:
            self._fileobj.close()


def _open_ipc(source: str | bytes | BinaryIO) -> Any:
    """An IPC file reader (random access to its batches) or, without the file magic, a stream reader."""
    import pyarrow as pa

    if isinstance(source, bytes):
        buf: Any = pa.py_buffer(source)
        head = source[:6]
    elif isinstance(source, str):
        buf = pa.memory_map(source)
        with open(source, "rb") as fh:
            head = fh.read(6)
    else:
        buf = source
        head = source.read(6)
        source.seek(0)
    if head == ARROW_MAGIC:
        if _tail(source) != ARROW_MAGIC:  # the IPC file format ends with its footer and the magic again
            raise IncompleteTable("no Arrow IPC footer: still being written, cut short, or not Arrow")
        return pa.ipc.open_file(buf)
    return pa.ipc.open_stream(buf)


def _head(source: str | bytes | BinaryIO) -> bytes:
    """The first (at most eight) bytes of a file."""
    if isinstance(source, bytes):
        return source[:8]
    if isinstance(source, str):
        with open(source, "rb") as fh:
            return fh.read(8)
    at = source.tell()
    source.seek(0)
    head = source.read(8)
    source.seek(at)
    return head


def _tail(source: str | bytes | BinaryIO) -> bytes:
    """The last six bytes of a file."""
    if isinstance(source, bytes):
        return source[-6:]
    if isinstance(source, str):
        with open(source, "rb") as fh:
            return _tail(fh)
    end = source.seek(0, 2)
    source.seek(max(0, end - 6))
    tail = source.read(6)
    source.seek(0)
    return tail


def _parquet_batches(pf: Any, columns: list[str], start: int, rows: int) -> Iterator[Any]:
    """Batches from row ``start``: whole row groups before it are skipped unread.

    Each row group gets its own ``iter_batches``: a single reader over many row groups kept their
    buffers in Arrow's memory pool (measured: +32 MiB every ~30 groups of 1e5 rows; per group: flat).
    """
    md = pf.metadata
    groups: list[int] = []
    skip = start
    for i in range(md.num_row_groups):
        n = md.row_group(i).num_rows
        if not groups and skip >= n:
            skip -= n
            continue
        groups.append(i)
    for g in groups:  # one reader per row group: one reader over all of them holds on to their buffers
        for b in pf.iter_batches(batch_size=rows, row_groups=[g], columns=columns):
            if skip:
                if skip >= b.num_rows:
                    skip -= b.num_rows
                    continue
                b, skip = b.slice(skip), 0
            yield b


def _ipc_batches(reader: Any, columns: list[str], start: int) -> Iterator[Any]:
    batches = (reader.get_batch(i) for i in range(reader.num_record_batches)) \
        if hasattr(reader, "num_record_batches") else iter(reader)
    skip = start
    for b in batches:
        if skip >= b.num_rows:
            skip -= b.num_rows
            continue
        b, skip = b.slice(skip), 0
        yield b.select(columns)
