"""Read offline inputs (events, CSV, NPZ, Parquet/Arrow) into arrays for ``calmon check`` / ``fit`` / ``apply``.

Formats
-------
* **JSON Lines** events as in :mod:`calmon.events.decoder`, plain or compressed with gzip (``.gz``), zstd
  (``.zst``), bzip2 (``.bz2``) or xz (``.xz``; all recognised by their magic bytes), read and decoded in
  chunks by :mod:`calmon.offline.accumulator`;
  predictions and outcomes are joined by id with the agent's :class:`calmon.state.join.Joiner` (without
  a time limit: the whole file is one batch).
* **Parquet** and **Arrow IPC** (``.arrow``/``.feather``) files, or a directory of them (``*.parquet``,
  ``*.arrow``, ... in sorted path order, hidden and ``_``-prefixed names skipped): streamed by record
  batch, only the needed columns read (:mod:`calmon.formats.parquet`), each row decoded as a JSON object, so
  memory does not grow with the file beyond the arrays ``check`` keeps (``benchmarks/bench_parquet.py``).
  Without a schema mapping the columns are named as in CSV; a file without ``model`` column takes the
  ``--model`` name (or is the only model).
* **CSV** with a header (read as :mod:`calmon.formats.csvrows` reads it for the agent): ``score,label``
  (binary), ``p0,...,p{K-1},label`` (multiclass) or ``confidence,correct`` (top-label); an
  optional ``id`` column is kept. With a schema mapping, a row is an object keyed by the header's names
  (cells that are JSON numbers become numbers) and goes through the mapped decoder.
* **NPZ**: ``confidence`` + ``correct``, ``score`` + ``label``, or ``probs`` + ``labels``
  (loaded with ``allow_pickle=False``).

Any invalid record stops the read with :class:`InputError`, whose message is one line naming
the file, the line or row (or array) and the field; with ``skip_invalid`` invalid events are
counted by reason code and skipped instead. Records are decoded by :class:`calmon.events.decoder.Decoder`,
which never raises for a record (invalid UTF-8, deep nesting, huge numbers all get a reason code),
but without the agent's wall-clock limits: offline files are historical and event times do not
change the result of ``check``, so ``future_timestamp``/``past_timestamp`` are never raised here
(epoch numbers above 1e11, probable milliseconds, are still ``bad_timestamp`` without a mapping's
``ts_unit``). A truncated or corrupt compressed stream is an :class:`InputError` too, and so is a decompression
bomb (a stream expanding more than 100 times over 64 MiB of output, :mod:`calmon.formats.compressed`): it is
stopped there, so ``calmon check bomb.jsonl.gz`` answers at once. Compressed input is decompressed in bounded
pieces, and a line of compressed JSON Lines longer than 16 MiB is read past without being held (``too_large``).
A file of a directory named like a table (``*.parquet``...) that is not one is an error, not skipped.
"""

from __future__ import annotations

import io
import itertools
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import msgspec
import numpy as np

from calmon.formats.compressed import CorruptStream, DecompressedReader, DecompressionBomb, codec_of
from calmon.formats.csvobjects import cell_value
from calmon.formats.csvrows import CsvLayout, read_rows
from calmon.formats.parquet import (
    TABLE_SUFFIXES,
    TableError,
    TableFile,
    batch_records,
    canonical_plan,
    mapped_plan,
    table_kind,
)
from calmon.offline.accumulator import Chunk, EventAccumulator, jsonl_chunks, make_decoder
from calmon.offline.dataset import Dataset, InputError
from connectors.filewhole import CompressedLines

if TYPE_CHECKING:
    from calmon.events.schema import Mapping
__all__ = ["Dataset", "InputError", "read_input"]

_JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
_SNIFF = 1 << 16
_PIECE = 4 << 20
_MAX_LINE = 16 << 20  # a longer line of a compressed input is too_large, read past without being held
_DEFAULT_MODEL = "default"  # the model of a table without model column when no --model is given


def read_input(path: str, model: str | None = None, skip_invalid: bool = False,
               mapping: Mapping | None = None) -> Dataset:
    """Read ``path`` (a file, a directory of Parquet/Arrow files, or ``-`` for standard input).

    The format follows the content (gzip/zstd/bzip2/xz, Parquet and Arrow magic bytes, ``{`` for JSON Lines)
    and the extension; ``mapping`` (:func:`calmon.events.schema.load_mapping`) is applied to every event
    record (JSON Lines, table rows, CSV rows).
    """
    if path == "-":
        return _read_data("<stdin>", sys.stdin.buffer.read(), "", model, skip_invalid, mapping)
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such file")
    if p.is_dir():
        return _read_tables(path, _table_files(p), model, skip_invalid, mapping)
    with p.open("rb") as fh:
        head = fh.read(_SNIFF)
    kind = table_kind(head, path)
    if kind is not None:
        return _read_tables(path, [(path, kind, path)], model, skip_invalid, mapping)
    codec = codec_of(head)
    if codec is not None:
        return _read_compressed(path, codec, model, skip_invalid, mapping)
    suffix = p.suffix.lower()
    if head.strip() and _is_jsonl(suffix, head):
        return _read_events(path, jsonl_chunks(path, _file_pieces(p)), model, skip_invalid, mapping)
    return _read_data(path, p.read_bytes(), suffix, model, skip_invalid, mapping)


def _is_jsonl(suffix: str, head: bytes) -> bool:
    return suffix != ".csv" and (suffix in _JSONL_SUFFIXES or head.lstrip()[:1] == b"{")


def _file_pieces(p: Path) -> Iterator[bytes]:
    with p.open("rb") as fh:
        while piece := fh.read(_PIECE):
            yield piece


def _read_data(name: str, data: bytes, suffix: str, model: str | None, skip_invalid: bool,
               mapping: Mapping | None) -> Dataset:
    """An input held in memory (standard input, a CSV or NPZ file, decompressed CSV)."""
    if not data.strip():
        raise InputError(f"{name}: empty input, no events")
    kind = table_kind(data[:8])
    if kind is not None:
        return _read_tables(name, [(data, kind, name)], model, skip_invalid, mapping)
    codec = codec_of(data[:4])
    if codec is not None:
        return _read_stream(name, lambda: io.BytesIO(data), codec, "", model, skip_invalid, mapping)
    if suffix == ".npz" or data[:4] == b"PK\x03\x04":
        return _read_npz(name, data)
    if not _is_jsonl(suffix, data[:_SNIFF]):
        return _read_csv(name, data) if mapping is None else _read_csv_mapped(name, data, model, skip_invalid,
                                                                              mapping)
    return _read_events(name, jsonl_chunks(name, [data]), model, skip_invalid, mapping)


def _read_compressed(path: str, codec: str, model: str | None, skip_invalid: bool,
                     mapping: Mapping | None) -> Dataset:
    """A compressed file: JSON Lines are decoded as they are decompressed; CSV and NPZ decompressed whole."""
    inner = Path(Path(path).stem).suffix.lower()  # events.jsonl.gz -> .jsonl
    return _read_stream(path, lambda: open(path, "rb"), codec, inner, model, skip_invalid, mapping)


def _read_stream(name: str, opener: Callable[[], BinaryIO], codec: str, inner: str, model: str | None,
                 skip_invalid: bool, mapping: Mapping | None) -> Dataset:
    """A compressed stream (``opener`` opens it at its start; it is read twice: its first bytes tell JSON Lines
    from CSV), decompressed in bounded pieces (:mod:`calmon.formats.compressed`): a decompression bomb stops it
    with one line, and so does a truncated or corrupt stream."""
    try:
        with opener() as fh:
            head = _first_bytes(DecompressedReader(fh.read, codec))
        with opener() as fh:
            if _is_jsonl(inner, head[:_SNIFF]):
                lines = CompressedLines(fh.read, codec, 0, 1, _MAX_LINE)
                return _read_events(name, _line_chunks(name, lines), model, skip_invalid, mapping,
                                    max_record_bytes=_MAX_LINE)
            data = b"".join(iter(DecompressedReader(fh.read, codec).read, b""))
        return _read_data(name, data, inner, model, skip_invalid, mapping)
    except CorruptStream as exc:
        raise InputError(f"{name}: {exc}") from None


def _first_bytes(r: DecompressedReader) -> bytes:
    """The decompressed bytes from the first that is not white space (or ``b""``)."""
    while piece := r.read():
        if piece.strip():
            return piece.lstrip()
    return b""


def _line_chunks(name: str, lines: CompressedLines, n: int = 65_536) -> Iterator[Chunk]:
    """The non-blank lines of a compressed stream as chunks (a line longer than :data:`_MAX_LINE` as one
    :class:`~calmon.formats.records.OversizedRecord`, never held: the decoder rejects it as ``too_large``)."""
    recs: list[bytes] = []
    nums: list[int] = []
    while not lines.finished:
        for seg in lines.read(n):
            if seg.oversized is not None and seg.oversized.reason == DecompressionBomb.reason:
                raise InputError(f"{name}: line {seg.first}: {seg.oversized.reason}: {lines.error}")
            if seg.oversized is not None:
                recs.append(seg.oversized)
                nums.append(seg.first)
            for i, ln in enumerate(seg.lines or ()):
                if ln.strip():
                    recs.append(ln)
                    nums.append(seg.first + i)
        if len(recs) >= n or (lines.finished and recs):
            yield Chunk(name, recs, nums)
            recs, nums = [], []
    if lines.error is not None:
        raise InputError(f"{name}: {lines.error}")


def _read_events(name: str, chunks: Iterator[Chunk], model: str | None, skip_invalid: bool,
                 mapping: Mapping | None, what: str = "line", max_record_bytes: float = math.inf) -> Dataset:
    decoder = make_decoder(mapping)
    decoder.max_record_bytes = max_record_bytes
    acc = EventAccumulator(decoder, what)
    acc.add_all(chunks)
    return acc.dataset(name, model, skip_invalid)


def _table_files(d: Path) -> list[tuple[str | bytes, str, str]]:
    """The Parquet/Arrow files under a directory, in sorted path order (hidden and ``_`` names skipped)."""
    found: list[tuple[str | bytes, str, str]] = []
    for f in sorted(d.rglob("*")):
        rel = f.relative_to(d).parts
        if f.is_file() and f.name.lower().endswith(TABLE_SUFFIXES) and not any(x[:1] in "._" for x in rel):
            with f.open("rb") as fh:
                head = fh.read(8)
            kind = table_kind(head, str(f))
            if kind is None:
                raise InputError(f"{f}: not a Parquet or Arrow file (it begins with {head!r}); move it out of {d}")
            found.append((str(f), kind, str(f)))
    if not found:
        raise InputError(f"{d}: is a directory without Parquet or Arrow files (*.parquet, *.arrow, *.feather)")
    return found


def _read_tables(name: str, files: list[tuple[str | bytes, str, str]], model: str | None, skip_invalid: bool,
                 mapping: Mapping | None) -> Dataset:
    """Parquet/Arrow files (``(path or bytes, kind, label)``) streamed batch by batch through one decoder."""
    acc = EventAccumulator(make_decoder(mapping), "row")
    injected = False
    top_label = True
    for src, kind, label in files:
        table = None
        try:
            table = TableFile(src, kind)
            if mapping is not None:
                plan = mapped_plan(table.names, mapping.columns)
            else:
                plan = canonical_plan(table.names, model or _DEFAULT_MODEL)
            injected |= bool(plan.const)
            top_label &= plan.top_label
            row = 1
            for batch in table.batches(plan.read):
                records = batch_records(batch, plan)
                acc.add(Chunk(label, records, range(row, row + len(records))))
                row += len(records)
        except TableError as exc:
            raise InputError(f"{label}: {exc}") from None
        finally:
            if table is not None:
                table.close()
    ds = acc.dataset(name, model or (_DEFAULT_MODEL if injected else None), skip_invalid)
    if injected and model is None:
        ds.model = None  # like a CSV file: no model named anywhere
    ds.top_label_only = top_label and ds.classes == 2
    return ds


def _read_csv_mapped(name: str, data: bytes, model: str | None, skip_invalid: bool, mapping: Mapping) -> Dataset:
    """CSV rows as objects keyed by the header's names, decoded with the schema mapping."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{name}: not UTF-8 text (is it a binary file?)") from None
    rows = read_rows(text.removeprefix("\ufeff"))
    first = next(rows, None)
    if first is None:
        raise InputError(f"{name}: empty input, no events")
    header = [c.strip() for c in first[1]]
    enc = msgspec.json.Encoder().encode

    def chunks() -> Iterator[Chunk]:
        while batch := list(itertools.islice(rows, 65_536)):
            recs = [enc({k: cell_value(v) for k, v in zip(header, cells) if v != ""}) for _, cells in batch]
            yield Chunk(name, recs, [n for n, _ in batch])

    return _read_events(name, chunks(), model, skip_invalid, mapping)


def _check_arrays(name: str, z: np.ndarray, y: np.ndarray, what: str) -> None:
    if z.size == 0:
        raise InputError(f"{name}: no rows")
    bad = ~np.isfinite(z) | (z < 0) | (z > 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{name}: {what} {i + 1}: score {z.flat[i]!r} is not a probability in [0, 1]")


def _read_npz(name: str, data: bytes) -> Dataset:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except Exception as e:  # noqa: BLE001 - np.load's zip and npy readers raise many unrelated types
        raise InputError(f"{name}: not a readable NPZ file ({type(e).__name__})") from None
    if "probs" in arrays and "labels" in arrays:
        probs = _floats(name, "probs", arrays["probs"])
        labels = _floats(name, "labels", arrays["labels"])
        if probs.ndim != 2 or probs.shape[1] < 2 or labels.shape != (probs.shape[0],):
            raise InputError(f"{name}: probs must be (n, K >= 2) and labels (n,), got {probs.shape}, {labels.shape}")
        return _multiclass(name, probs, labels, None, "row")
    for zk, yk, top in (("confidence", "correct", True), ("score", "label", False)):
        if zk in arrays and yk in arrays:
            for key in (zk, yk):
                if arrays[key].ndim != 1:
                    raise InputError(f"{name}: array {key!r} must be 1-D (n,), got shape {arrays[key].shape}")
            z = _floats(name, zk, arrays[zk])
            y = _floats(name, yk, arrays[yk])
            if z.shape != y.shape:
                raise InputError(f"{name}: {zk} and {yk} have different lengths {z.size} and {y.size}")
            _check_arrays(name, z, y, "row")
            bad = (y != 0) & (y != 1)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise InputError(f"{name}: row {i + 1}: {yk} {y[i]!r} is not 0 or 1")
            return Dataset(name, 2, z, y, top_label_only=top)
    raise InputError(f"{name}: NPZ needs arrays confidence+correct, score+label or probs+labels; has {sorted(arrays)}")


def _floats(name: str, key: str, a: np.ndarray) -> np.ndarray:
    """An NPZ array as float64, or a one-line error (strings, objects, complex numbers...)."""
    if a.dtype.kind not in "biuf":
        raise InputError(f"{name}: array {key!r} must hold numbers, got dtype {a.dtype}")
    return np.asarray(a, dtype=np.float64)


def _multiclass(name: str, probs: np.ndarray, labels: np.ndarray, ids: np.ndarray | None, what: str,
                lines: list[int] | None = None, tol: float = 1e-3) -> Dataset:
    """A multiclass dataset (binary when K = 2); ``lines`` number the rows in messages (default 1, 2, ...)."""
    k = probs.shape[1]
    bad = ~np.isfinite(probs).all(axis=1) | (probs < 0).any(axis=1) | (probs > 1).any(axis=1)
    bad |= np.abs(probs.sum(axis=1) - 1.0) > tol
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{name}: {what} {_row(i, lines)}: probs are not a probability vector "
                         f"(sum {probs[i].sum():.6g})")
    lab = np.asarray(labels, dtype=np.float64)
    badl = ~np.isfinite(lab) | (lab < 0) | (lab >= k) | (lab != np.round(lab))
    if badl.any():
        i = int(np.flatnonzero(badl)[0])
        raise InputError(f"{name}: {what} {_row(i, lines)}: label {labels[i]!r} is not a class index below {k}")
    labels = lab.astype(np.int64)
    if k == 2:
        return Dataset(name, 2, probs[:, 1].copy(), labels.astype(np.float64), ids=ids)
    pred = probs.argmax(axis=1)
    z = probs[np.arange(len(probs)), pred]
    return Dataset(name, k, z, (pred == labels).astype(np.float64), probs=probs, labels=labels, ids=ids)


def _row(i: int, lines: list[int] | None) -> int:
    return i + 1 if lines is None else lines[i]


def _read_csv(name: str, data: bytes) -> Dataset:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{name}: not UTF-8 text (is it a binary file?)") from None
    rows = list(read_rows(text))
    if not rows:
        raise InputError(f"{name}: empty input, no events")
    header, body = rows[0][1], rows[1:]
    if not body:
        raise InputError(f"{name}: header but no rows")
    layout = CsvLayout.from_names(header)
    score, label, id_col = layout.column("score"), layout.column("label"), layout.column("id")
    if label is None or (score is None and not layout.probs):
        raise InputError(f"{name}: line 1: header needs score,label or confidence,correct or p0..pK-1,label; "
                         f"got {','.join(header)[:80]}")
    if layout.error is not None:
        raise InputError(f"{name}: line 1: {layout.error}")
    needed = [score] if score is not None else list(layout.probs)
    values = _csv_numbers(name, body, [*needed, label], layout)
    ids = np.array([cells[id_col] if id_col < len(cells) else "" for _, cells in body], dtype=object) \
        if id_col is not None else None
    if score is None:
        return _multiclass(name, values[:, :-1], values[:, -1], ids, "line", [n for n, _ in body])
    z, y = values[:, 0], values[:, 1]
    for bad, col, what in ((~np.isfinite(z) | (z < 0) | (z > 1), score, "is not a probability in [0, 1]"),
                           ((y != 0) & (y != 1), label, "is not 0 or 1")):
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            v = values[i, 0 if col == score else 1]
            raise InputError(f"{name}: line {body[i][0]}: field {layout.names[col]!r}: {v!r} {what}")
    return Dataset(name, 2, z.copy(), y.copy(), ids=ids, top_label_only=layout.top_label)


def _csv_numbers(name: str, body: list[tuple[int, list[str]]], cols: list[int], layout: CsvLayout) -> np.ndarray:
    """The cells of ``cols`` as floats; the first cell that is not a number stops the read."""
    values = np.empty((len(body), len(cols)))
    for r, (line, cells) in enumerate(body):
        for c, col in enumerate(cols):
            try:
                values[r, c] = float(cells[col])
            except (ValueError, IndexError):
                cell = cells[col] if col < len(cells) else "<missing>"
                raise InputError(f"{name}: line {line}: field {layout.names[col]!r}: {cell[:40]!r} "
                                 f"is not a number") from None
    return values


