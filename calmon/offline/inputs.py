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

Several inputs
---------------
:func:`read_inputs` reads several paths as one input -- files of any of the formats above, directories (every
supported file under them, in sorted path order, hidden and ``_``-prefixed names skipped) and glob patterns
(``'logs/2026-*/*.jsonl.gz'``, ``**`` included). Every event record of every input goes through one decoder and one
join, so predictions in one file and their outcomes in another are joined by id exactly as the agent joins them
(with no time limit); CSV and NPZ rows of labeled predictions are appended as they are.

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
A file named like a table (``*.parquet``...) that is not one is an error, not skipped.
"""

from __future__ import annotations

import glob
import io
import itertools
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import msgspec
import numpy as np

from calmon.events.suggest import suggest_mapping
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
__all__ = ["Dataset", "InputError", "read_input", "read_inputs", "expand_inputs", "INPUTS_HELP"]

#: The help of the commands' ``input`` arguments (``nargs="+"``).
INPUTS_HELP = ("files (.jsonl, .csv, .npz, .parquet, .arrow; compressed too), directories, glob patterns, or - for "
               "standard input; predictions and outcomes in different inputs are joined by id")

_JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
_SNIFF = 1 << 16
_PIECE = 4 << 20
_MAX_LINE = 16 << 20  # a longer line of a compressed input is too_large, read past without being held
DEFAULT_MODEL = "default"  # the model of a table without model column when no --model is given


def read_input(path: str, model: str | None = None, skip_invalid: bool = False,
               mapping: Mapping | None = None) -> Dataset:
    """Read ``path`` (a file, a directory, a glob pattern, or ``-`` for standard input): :func:`read_inputs`."""
    return read_inputs([path], model, skip_invalid, mapping)


def read_inputs(paths: Sequence[str], model: str | None = None, skip_invalid: bool = False,
                mapping: Mapping | None = None) -> Dataset:
    """Read every input of ``paths`` as one dataset: events of all of them decoded and joined together.

    The format of each file follows its content (gzip/zstd/bzip2/xz, Parquet and Arrow magic bytes, ``{`` for JSON
    Lines) and its extension; ``mapping`` (:func:`calmon.events.schema.load_mapping`) is applied to every event record
    (JSON Lines, table rows, CSV rows). Directories and glob patterns are expanded by :func:`expand_inputs`.

    Examples
    --------
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with open(os.path.join(d, "predictions.jsonl"), "w") as f:
    ...     _ = f.write('{"type": "prediction", "id": "a", "model": "m", "score": 0.8}\\n'
    ...                 '{"type": "prediction", "id": "b", "model": "m", "score": 0.3}\\n')
    >>> with open(os.path.join(d, "outcomes.jsonl"), "w") as f:
    ...     _ = f.write('{"type": "outcome", "id": "a", "label": 1}\\n{"type": "outcome", "id": "z", "label": 0}\\n')
    >>> ds = read_inputs([os.path.join(d, "predictions.jsonl"), os.path.join(d, "outcomes.jsonl")])
    >>> ds.n, ds.joined, ds.unjoined_predictions, ds.orphan_outcomes
    (1, 1, 1, 1)
    >>> read_input(d).n  # the directory: the same two files
    1
    """
    files = expand_inputs(paths)
    names = ["<stdin>" if f == "-" else f for f in files]
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    name = names[0] if len(names) == 1 else f"{len(names)} inputs ({shown})"
    ins = _Inputs(mapping, model)
    for f in files:
        ins.add_path(f)
    return ins.dataset(name, model, skip_invalid)


_KNOWN = (*_JSONL_SUFFIXES, ".csv", ".npz", *TABLE_SUFFIXES)
_COMPRESSED = (".gz", ".zst", ".bz2", ".xz")


def _supported(name: str) -> bool:
    n = name.lower()
    for c in _COMPRESSED:
        n = n.removesuffix(c)
    return n.endswith(_KNOWN)


def expand_inputs(paths: Sequence[str]) -> list[str]:
    """Files named by ``paths``: each a file, ``-``, a directory (its supported files) or a glob pattern.

    A directory contributes every file under it whose name ends in a supported extension (``.jsonl``, ``.json``,
    ``.ndjson``, ``.csv``, ``.npz``, Parquet/Arrow, each optionally ``.gz``/``.zst``/``.bz2``/``.xz``), in sorted path
    order, hidden and ``_``-prefixed names skipped (like Spark's and pyarrow's datasets). A pattern that matches
    nothing, a directory without such files and a missing path are :class:`InputError` s.
    """
    if not paths:
        raise InputError("no input given")
    out: list[str] = []
    for path in paths:
        if path == "-":
            out.append(path)
            continue
        p = Path(path)
        if p.is_dir():
            found = [str(f) for f in sorted(p.rglob("*")) if f.is_file() and _supported(f.name)
                     and not any(x[:1] in "._" for x in f.relative_to(p).parts)]
            if not found:
                raise InputError(f"{path}: is a directory without supported files (*.jsonl, *.csv, *.npz, "
                                 "*.parquet, *.arrow, *.feather; optionally .gz/.zst/.bz2/.xz)")
            out.extend(found)
        elif p.exists():
            out.append(path)
        elif glob.has_magic(path):
            found = sorted(f for f in glob.glob(path, recursive=True) if Path(f).is_file())
            if not found:
                raise InputError(f"{path}: no file matches this pattern")
            out.extend(found)
        else:
            raise InputError(f"{path}: no such file")
    if out.count("-") > 1:
        raise InputError("-: standard input can be read only once")
    return out


class _Inputs:
    """Every input of one command: event records into one accumulator (one decoder, one join), rows of CSV/NPZ
    files of labeled predictions into datasets appended at the end."""

    def __init__(self, mapping: Mapping | None, model: str | None) -> None:
        self.mapping = mapping
        self.model = model  # the model of a table without model column (default: "default")
        self.acc: EventAccumulator | None = None
        self.rows: list[Dataset] = []
        self.injected = False  # a table without model column took the default model
        #: Every event input was a table of top-label columns (confidence, correct); None before the first one.
        self.top_label: bool | None = None

    def events(self, chunks: Iterator[Chunk], what: str = "line", top_label: bool = False,
               max_record_bytes: float = math.inf) -> None:
        self.top_label = top_label and self.top_label is not False
        if self.acc is None:
            decoder = make_decoder(self.mapping)
            decoder.max_record_bytes = math.inf
            self.acc = EventAccumulator(decoder, what)
        # compressed lines beyond _MAX_LINE arrive as an OversizedRecord: rejected by length, never held
        self.acc.decoder.max_record_bytes = min(self.acc.decoder.max_record_bytes, max_record_bytes)
        self.acc.add_all(chunks, what)

    def add_path(self, path: str) -> None:
        """Read one file (or ``-``) into the accumulator or the row datasets."""
        if path == "-":
            self.add_data("<stdin>", sys.stdin.buffer.read(), "")
            return
        p = Path(path)
        with p.open("rb") as fh:
            head = fh.read(_SNIFF)
        kind = table_kind(head, path)
        if kind is not None:
            self.add_tables([(path, kind, path)])
            return
        if p.name.lower().endswith(TABLE_SUFFIXES):
            raise InputError(f"{path}: not a Parquet or Arrow file (it begins with {head[:8]!r})")
        codec = codec_of(head)
        if codec is not None:
            inner = Path(p.stem).suffix.lower()  # events.jsonl.gz -> .jsonl
            self.add_stream(path, lambda: open(path, "rb"), codec, inner)
            return
        suffix = p.suffix.lower()
        if head.strip() and _is_jsonl(suffix, head):
            self.events(jsonl_chunks(path, _file_pieces(p)))
            return
        self.add_data(path, p.read_bytes(), suffix)

    def add_data(self, name: str, data: bytes, suffix: str) -> None:
        """An input held in memory (standard input, a CSV or NPZ file, decompressed CSV)."""
        if not data.strip():
            raise InputError(f"{name}: empty input, no events")
        kind = table_kind(data[:8])
        if kind is not None:
            self.add_tables([(data, kind, name)])
            return
        codec = codec_of(data[:4])
        if codec is not None:
            self.add_stream(name, lambda: io.BytesIO(data), codec, "")
            return
        if suffix == ".npz" or data[:4] == b"PK\x03\x04":
            self.rows.append(_read_npz(name, data))
        elif _is_jsonl(suffix, data[:_SNIFF]):
            self.events(jsonl_chunks(name, [data]))
        elif self.mapping is None:
            self.rows.append(_read_csv(name, data))
        else:
            self.events(_csv_mapped_chunks(name, data))

    def add_stream(self, name: str, opener: Callable[[], BinaryIO], codec: str, inner: str) -> None:
        """A compressed stream (``opener`` opens it at its start; it is read twice: its first bytes tell JSON Lines
        from CSV), decompressed in bounded pieces (:mod:`calmon.formats.compressed`): a decompression bomb stops it
        with one line, and so does a truncated or corrupt stream."""
        try:
            with opener() as fh:
                head = _first_bytes(DecompressedReader(fh.read, codec))
            with opener() as fh:
                if _is_jsonl(inner, head[:_SNIFF]):
                    lines = CompressedLines(fh.read, codec, 0, 1, _MAX_LINE)
                    self.events(_line_chunks(name, lines), max_record_bytes=_MAX_LINE)
                    return
                data = b"".join(iter(DecompressedReader(fh.read, codec).read, b""))
            self.add_data(name, data, inner)
        except CorruptStream as exc:
            raise InputError(f"{name}: {exc}") from None

    def add_tables(self, files: list[tuple[str | bytes, str, str]]) -> None:
        """Parquet/Arrow files (``(path or bytes, kind, label)``) streamed batch by batch."""
        for src, kind, label in files:
            table = None
            try:
                table = TableFile(src, kind)
                if self.mapping is not None:
                    plan = mapped_plan(table.names, self.mapping.columns)
                else:
                    plan = canonical_plan(table.names, self.model or DEFAULT_MODEL)
                self.injected |= bool(plan.const)

                def chunks(table: TableFile = table, plan: Any = plan, label: str = label) -> Iterator[Chunk]:
                    row = 1
                    for batch in table.batches(plan.read):
                        records = batch_records(batch, plan)
                        yield Chunk(label, records, range(row, row + len(records)))
                        row += len(records)

                self.events(chunks(), "row", plan.top_label)
            except TableError as exc:
                hint = _table_hint(table, label) if self.mapping is None and table is not None else ""
                raise InputError(f"{label}: {exc}{hint}") from None
            finally:
                if table is not None:
                    table.close()

    def dataset(self, name: str, model: str | None, skip_invalid: bool) -> Dataset:
        """The labeled dataset of every input (events joined together, then the rows of CSV/NPZ inputs)."""
        parts: list[Dataset] = []
        if self.acc is not None:
            ds = self.acc.dataset(name, model or (DEFAULT_MODEL if self.injected else None), skip_invalid)
            if self.injected and model is None:
                ds.model = None  # like a CSV file: no model named anywhere
            ds.top_label_only = bool(self.top_label) and ds.classes == 2
            parts.append(ds)
        parts.extend(self.rows)
        return parts[0] if len(parts) == 1 else _concat_datasets(name, parts)


def _table_hint(table: TableFile, label: str) -> str:
    """The ``--map`` options proposed from a table's first rows whose columns are not named as calmon's."""
    try:
        plan = mapped_plan(table.names, None)
        rows = [msgspec.json.decode(r) for b in itertools.islice(table.batches(plan.read, rows=500), 1)
                for r in batch_records(b, plan)]
        options = suggest_mapping([(label, rows)]).map_options()
    except (TableError, ValueError):
        return f"; `calmon schema suggest {label}` proposes a schema mapping for your columns"
    maps = " ".join(f"--map '{o}'" if set(o) & set(" {}[]") else f"--map {o}" for o in options)
    return f"; your columns look like: {maps} (`calmon schema suggest` writes a schema file, for --schema)"


def _concat_datasets(name: str, parts: list[Dataset]) -> Dataset:
    """Several datasets of the same kind as one (rows in input order)."""
    first = parts[0]
    for d in parts[1:]:
        if d.classes != first.classes or d.top_label_only != first.top_label_only:
            raise InputError(f"{name}: inputs of different kinds: {first.source} has {first.kind} data with "
                             f"{first.classes} classes, {d.source} has {d.kind} data with {d.classes}")

    def cat(attr: str, fill: Any) -> np.ndarray | None:
        arrays = [getattr(d, attr) for d in parts]
        if all(a is None for a in arrays):
            return None
        return np.concatenate([a if a is not None else fill(d) for a, d in zip(arrays, parts)])

    skipped: dict[str, int] = {}
    for d in parts:
        for k, v in d.skipped.items():
            skipped[k] = skipped.get(k, 0) + v
    models = {d.model for d in parts if d.model is not None}
    return Dataset(name, first.classes, np.concatenate([d.z for d in parts]), np.concatenate([d.y for d in parts]),
                   probs=cat("probs", lambda d: np.full((d.n, first.classes), np.nan)) if first.probs is not None
                   else None,
                   labels=cat("labels", lambda d: np.full(d.n, -1, dtype=np.int64)),
                   ids=cat("ids", lambda d: np.full(d.n, "", dtype=object)),
                   ts=cat("ts", lambda d: np.full(d.n, np.nan)),
                   model=models.pop() if len(models) == 1 else None, top_label_only=first.top_label_only,
                   joined=sum(d.joined for d in parts),
                   unjoined_predictions=sum(d.unjoined_predictions for d in parts),
                   orphan_outcomes=sum(d.orphan_outcomes for d in parts), skipped=skipped)


def _is_jsonl(suffix: str, head: bytes) -> bool:
    return suffix != ".csv" and (suffix in _JSONL_SUFFIXES or head.lstrip()[:1] == b"{")


def _file_pieces(p: Path) -> Iterator[bytes]:
    with p.open("rb") as fh:
        while piece := fh.read(_PIECE):
            yield piece


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


def _csv_mapped_chunks(name: str, data: bytes) -> Iterator[Chunk]:
    """CSV rows as objects keyed by the header's names, for the schema mapping's decoder."""
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
    while batch := list(itertools.islice(rows, 65_536)):
        recs = [enc({k: cell_value(v) for k, v in zip(header, cells) if v != ""}) for _, cells in batch]
        yield Chunk(name, recs, [n for n, _ in batch])


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
                         f"got {','.join(header)[:80]}; columns of your own names? `calmon schema suggest {name}` "
                         "proposes a schema mapping for them (--schema)")
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


_BOOLEAN_CELLS = {"true": 1.0, "false": 0.0}


def _csv_numbers(name: str, body: list[tuple[int, list[str]]], cols: list[int], layout: CsvLayout) -> np.ndarray:
    """The cells of ``cols`` as floats; the first cell that is not a number stops the read."""
    values = np.empty((len(body), len(cols)))
    label = layout.column("label")
    for r, (line, cells) in enumerate(body):
        for c, col in enumerate(cols):
            try:
                values[r, c] = float(cells[col])
            except (ValueError, IndexError):
                flag = _BOOLEAN_CELLS.get(cells[col].strip().lower()) if col == label and col < len(cells) else None
                if flag is not None:  # a boolean label is 1 or 0, as the agent reads CSV
                    values[r, c] = flag
                    continue
                cell = cells[col] if col < len(cells) else "<missing>"
                raise InputError(f"{name}: line {line}: field {layout.names[col]!r}: {cell[:40]!r} "
                                 f"is not a number") from None
    return values


