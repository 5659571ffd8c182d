"""A bounded sample of each input's records as JSON objects, for ``calmon schema suggest`` and error hints.

:func:`sample_inputs` takes the inputs ``calmon check`` takes (files, directories, globs; JSON Lines, CSV, Parquet
and Arrow, plain or gzip/zstd/bzip2/xz) and returns, per file, its first records as Python objects: JSON Lines
lines decoded, CSV rows keyed by the header's names (cells as :func:`calmon.formats.csvobjects.cell_value` reads
them), table rows with their own column names. Reading stops after ``limit`` records or ``max_bytes`` bytes of a
file, so a sample costs the same whatever the input's size; decompression is bounded as everywhere
(:mod:`calmon.formats.compressed`). NPZ arrays are not records and are skipped.

Examples
--------
>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> with open(os.path.join(d, "a.csv"), "w") as f:
...     _ = f.write("rid,p,y\\nr1,0.25,true\\n")
>>> sample_inputs([d])
[('...a.csv', [{'rid': 'r1', 'p': 0.25, 'y': True}])]
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import msgspec

from calmon.formats.compressed import CorruptStream, DecompressedReader, codec_of
from calmon.formats.csvobjects import cell_value
from calmon.formats.csvrows import read_rows
from calmon.formats.parquet import TableError, TableFile, batch_records, mapped_plan, table_kind
from calmon.offline.dataset import InputError
from calmon.offline.inputs import expand_inputs

__all__ = ["sample_inputs", "sample_records", "SAMPLE_RECORDS"]

SAMPLE_RECORDS = 2000  #: records sampled per file by default
_MAX_BYTES = 16 << 20  # bytes read (decompressed) per file at most
_decode = msgspec.json.Decoder().decode


def sample_inputs(paths: Sequence[str], limit: int = SAMPLE_RECORDS) -> list[tuple[str, list[Any]]]:
    """``(file, its first records)`` for every file named by ``paths`` (see the module docstring).

    Raises
    ------
    InputError
        One line naming the input that cannot be read.
    """
    out: list[tuple[str, list[Any]]] = []
    for path in expand_inputs(paths):
        if path == "-":
            out.append(("<stdin>", sample_records("<stdin>", sys.stdin.buffer.read(_MAX_BYTES), limit)))
            continue
        with open(path, "rb") as fh:
            head = fh.read(_MAX_BYTES)
        if path.lower().endswith(".npz") or head[:4] == b"PK\x03\x04":
            continue  # arrays, not records
        kind = table_kind(head[:1 << 16], path)
        if kind is not None:
            out.append((path, _table(path, kind, limit)))
            continue
        out.append((path, sample_records(path, head, limit, _opener(path))))
    if not out:
        raise InputError(f"{', '.join(paths)[:120]}: no file of records (JSON Lines, CSV, Parquet, Arrow) to sample")
    return out


def _opener(path: str) -> Callable[[], BinaryIO]:
    return lambda: open(path, "rb")


def sample_records(name: str, head: bytes, limit: int = SAMPLE_RECORDS,
                   opener: Callable[[], BinaryIO] | None = None) -> list[Any]:
    """The first ``limit`` records of a file whose first bytes are ``head`` (``opener`` reopens it when it is
    compressed, else ``head`` is decompressed as it is): JSON Lines or CSV."""
    codec = codec_of(head[:4])
    if codec is not None:
        try:
            with (opener() if opener is not None else io.BytesIO(head)) as fh:
                reader = DecompressedReader(fh.read, codec)
                parts: list[bytes] = []
                size = 0
                while size < _MAX_BYTES and (piece := reader.read()):
                    parts.append(piece)
                    size += len(piece)
                    if sum(p.count(b"\n") for p in parts) > limit + 1:
                        break
        except CorruptStream as exc:
            raise InputError(f"{name}: {exc}") from None
        head = b"".join(parts)
    text = head.lstrip()
    if text[:1] in (b"{", b"["):
        records: list[Any] = []
        for line in head.splitlines():
            if len(records) >= limit:
                break
            if line.strip():
                try:
                    records.append(_decode(line))
                except (msgspec.DecodeError, RecursionError):
                    continue  # a truncated last line or a bad record: not evidence of the shape
        return records
    return _csv(name, head, limit)


def _csv(name: str, data: bytes, limit: int) -> list[Any]:
    try:
        text = data.decode("utf-8", "replace").removeprefix("\ufeff")
    except UnicodeDecodeError:  # pragma: no cover - "replace" never raises
        raise InputError(f"{name}: not UTF-8 text") from None
    rows = read_rows(text)
    first = next(rows, None)
    if first is None:
        return []
    header = [c.strip() for c in first[1]]
    out: list[Any] = []
    for _, cells in rows:
        if len(out) >= limit:
            break
        if len(cells) == len(header):
            out.append({k: cell_value(v) for k, v in zip(header, cells) if v != ""})
    return out


def _table(path: str, kind: str, limit: int) -> list[Any]:
    table = None
    try:
        table = TableFile(path, kind)
        plan = mapped_plan(table.names, None)
        out: list[Any] = []
        for batch in table.batches(plan.read, rows=min(limit, 65536)):
            out += [_decode(r) for r in batch_records(batch, plan)]
            if len(out) >= limit:
                break
        return out[:limit]
    except TableError as exc:
        raise InputError(f"{path}: {exc}") from None
    finally:
        if table is not None:
            table.close()
