"""CSV rows of predictions and outcomes: one reading of a header, for ``calmon check`` and the file source.

A header names its columns (case-insensitive, surrounding blanks and a UTF-8 byte-order mark
ignored); :func:`parse_header` / :meth:`CsvLayout.from_names` map them to event fields:

* ``score`` (or ``confidence``, top-label) and ``label`` (or ``correct``): a binary score and its 0/1 label;
* ``p0, ..., p{K-1}`` and ``label``: K class probabilities and the class index;
* optional ``id``, ``model``, ``type``, ``segment`` (strings) and ``ts`` (number or RFC 3339).

Other columns are ignored. Two readers share the layout: :func:`calmon.offline.inputs.read_input` reads a whole
file into arrays (and stops at the first bad cell), :class:`CsvConverter` turns rows streamed by
:class:`connectors.files.FileSource` into JSON events for :class:`calmon.events.decoder.Decoder` (and never
raises: a bad row reaches the decoder, which names the reason).

Examples
--------
>>> lay = CsvLayout.from_names(["ID", " confidence", "correct", "extra"])
>>> lay.column("score"), lay.column("label"), lay.column("id"), lay.top_label, lay.error
(1, 2, 0, True, None)
>>> parse_header(b"p0,p2,label").error
'probability columns must be p0..p{K-1} without gaps'
>>> [(n, cells) for n, cells in read_rows("score,label\\n\\n0.5,1\\n")]
[(1, ['score', 'label']), (3, ['0.5', '1'])]
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["CsvLayout", "CsvConverter", "parse_header", "read_rows", "split_line"]

_STRING_KEYS = ("id", "model", "type", "segment")
_P_RE = re.compile(r"^p([0-9]+)$")


@dataclass(frozen=True)
class CsvLayout:
    """Which column of a CSV file holds which event field.

    Attributes
    ----------
    names
        The normalised column names (stripped, lower case).
    fields
        ``(column, json key, kind)`` for the recognised scalar columns; ``kind`` is ``num``
        (score), ``int`` (label), ``str`` (id, model, type, segment) or ``ts``.
    probs
        The columns of ``p0..p{K-1}`` in class order (empty for binary layouts).
    top_label
        True when the score column is named ``confidence`` (top-label confidence and correctness).
    error
        Why the header is unusable (duplicate or conflicting columns, gaps in ``p0..p{K-1}``, no
        known column), else ``None``.
    """

    names: tuple[str, ...]
    fields: tuple[tuple[int, str, str], ...]
    probs: tuple[int, ...]
    top_label: bool = False
    error: str | None = None

    def column(self, key: str) -> int | None:
        """The column of an event field (``"score"``, ``"label"``, ``"id"``, ...), or ``None``."""
        return next((i for i, k, _ in self.fields if k == key), None)

    @classmethod
    def from_names(cls, header: list[str]) -> CsvLayout:
        """The layout of a header given as its cells."""
        names = [c.strip().lower() for c in header]
        if names and names[0].startswith("\ufeff"):
            names[0] = names[0][1:].strip()
        fields: list[tuple[int, str, str]] = []
        probs: dict[int, int] = {}
        error = None
        for i, name in enumerate(names):
            if name in names[:i]:
                error = f"duplicate column {name!r}"
            m = _P_RE.match(name)
            if m:
                probs[int(m.group(1))] = i
            elif name in ("score", "confidence"):
                fields.append((i, "score", "num"))
            elif name in ("label", "correct"):
                fields.append((i, "label", "int"))
            elif name in _STRING_KEYS:
                fields.append((i, name, "str"))
            elif name == "ts":
                fields.append((i, "ts", "ts"))
        keys = [k for _, k, _ in fields]
        if keys.count("score") > 1 or keys.count("label") > 1:
            error = "conflicting columns (score/confidence or label/correct twice)"
        if probs and "score" in keys:
            error = "both score and p0..pK columns"
        if probs and sorted(probs) != list(range(len(probs))):
            error = "probability columns must be p0..p{K-1} without gaps"
        if not fields and not probs and error is None:
            error = "no known column (expected score,label | p0..p{K-1},label | confidence,correct)"
        top = any(names[i] == "confidence" for i, k, _ in fields if k == "score")
        return cls(tuple(names), tuple(fields), tuple(probs[k] for k in sorted(probs)), top, error)


def parse_header(header: bytes | str) -> CsvLayout:
    """The layout of a header line (bytes or text, without newline); never raises."""
    if isinstance(header, bytes):
        try:
            header = header.decode("utf-8")
        except UnicodeDecodeError:
            return CsvLayout((), (), (), error="header is not UTF-8")
    header = header.removeprefix("\ufeff")
    try:
        cells = split_line(header) if header else []
    except csv.Error as exc:
        return CsvLayout((), (), (), error=f"header is not CSV: {exc}")
    return CsvLayout.from_names(cells)


def split_line(text: str) -> list[str]:
    """The cells of one CSV line (quotes as in RFC 4180); raises ``csv.Error`` on a malformed line."""
    return next(csv.reader([text]), [])


def read_rows(text: str) -> Iterator[tuple[int, list[str]]]:
    """The non-empty rows of a CSV text with the number of the line each one ends on."""
    reader = csv.reader(io.StringIO(text))
    for cells in reader:
        if cells:
            yield reader.line_num, cells


_NUM = rb"(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)"
_STR = rb"([\x20\x21\x23-\x2b\x2d-\x5b\x5d-\x7e]+)"  # printable ASCII except '"', ',' and '\'
_INT = rb"(-?(?:0|[1-9][0-9]*))"
_SKIP = rb"[^,\"]*"
_NUM_RE = re.compile(_NUM)


class CsvConverter:
    """Convert CSV rows (bytes, one line each, no newline) to JSON-object bytes.

    Recognised columns (case-insensitive, surrounding blanks ignored) are one of the layouts
    ``score,label`` (binary P(y=1) and 0/1 label), ``p0,...,p{K-1},label`` (K class probabilities
    and class index) or ``confidence,correct`` (top-label confidence and 0/1 correctness, emitted as
    ``score`` and ``label``), plus the optional ``id, model, ts, type, segment``. Other columns are
    ignored. Numbers become JSON numbers, ``ts`` a number when numeric and a string otherwise (RFC
    3339); an empty cell omits its field (an outcome row leaves the score empty).

    A malformed row never raises: a row with the wrong number of fields, invalid UTF-8 or a
    header without any known column is passed through as the raw line (rejected by the decoder as
    ``not_json``/``not_object``), and a non-numeric value in a numeric column is emitted as a JSON
    string (rejected as ``bad_type``).

    Parameters
    ----------
    header
        The header line (bytes, without newline).

    Examples
    --------
    >>> c = CsvConverter(b"id,score,label")
    >>> for r in c.convert([b"a1,0.25,1", b"a2,,0", b"a3,high,1", b"a4,0.5"]):
    ...     print(r.decode())
    {"id":"a1","score":0.25,"label":1}
    {"id":"a2","label":0}
    {"id":"a3","score":"high","label":1}
    a4,0.5
    >>> CsvConverter(b"p0,p1,p2,label").convert([b"0.2,0.3,0.5,2"])
    [b'{"probs":[0.2,0.3,0.5],"label":2}']
    """

    def __init__(self, header: bytes) -> None:
        layout = parse_header(header)
        self.layout = layout
        self.error = layout.error
        self.ncols = len(layout.names)
        self.header = list(layout.names)
        self.cols = list(layout.fields)
        self.prob_idx = list(layout.probs)
        if self.error is None:
            self._build_fast()

    # the fast path: one regex match and one bytes % tuple per row
    def _build_fast(self) -> None:
        kinds: dict[int, tuple[str, str]] = {i: (k, kind) for i, k, kind in self.cols}
        pset = set(self.prob_idx)
        pats_num: list[bytes] = []
        pats_str: list[bytes] = []
        order: list[int] = []  # capture order (column indices)
        for i in range(self.ncols):
            if i in kinds:
                kind = kinds[i][1]
                num = _INT if kind == "int" else _NUM
                pats_num.append(_STR if kind == "str" else num)
                pats_str.append(_STR if kind in ("str", "ts") else num)
                order.append(i)
            elif i in pset:
                pats_num.append(_NUM)
                pats_str.append(_NUM)
                order.append(i)
            else:
                pats_num.append(_SKIP)
                pats_str.append(_SKIP)
        # the JSON template: fields in a fixed order (type, id, model, ts, segment, score/probs, label)
        pos = {col: j for j, col in enumerate(order)}
        rank = {"type": 0, "id": 1, "model": 2, "ts": 3, "segment": 4, "score": 5, "label": 7}
        fields = sorted(self.cols, key=lambda c: rank[c[1]])
        has_ts = any(k == "ts" for _, k, _ in self.cols)

        def template(ts_quoted: bool) -> tuple[bytes, list[int]]:
            parts: list[bytes] = []
            idx: list[int] = []
            items: list[tuple[int, bytes, list[int]]] = []
            for i, k, kind in fields:
                quoted = kind == "str" or (kind == "ts" and ts_quoted)
                items.append((rank[k], (b'"%s":"%%s"' if quoted else b'"%s":%%s') % k.encode(), [pos[i]]))
            if self.prob_idx:
                inner = b",".join([b"%s"] * len(self.prob_idx))
                items.append((6, b'"probs":[' + inner + b"]", [pos[i] for i in self.prob_idx]))
            items.sort(key=lambda t: t[0])
            for _, frag, ix in items:
                parts.append(frag)
                idx.extend(ix)
            return b"{" + b",".join(parts) + b"}", idx

        self._rx_num = re.compile(b",".join(pats_num))
        self._tpl_num, self._idx_num = template(False)
        self._rx_str = re.compile(b",".join(pats_str)) if has_ts else None
        self._tpl_str, self._idx_str = template(True)
        self._identity_num = self._idx_num == sorted(self._idx_num)
        self._identity_str = self._idx_str == sorted(self._idx_str)

    def convert(self, lines: list[bytes]) -> list[bytes]:
        """Convert rows to JSON-object bytes (one output per input row, same order).

        Parameters
        ----------
        lines
            CSV rows without their newline (a trailing ``\\r`` is ignored).

        Returns
        -------
        list of bytes
            One record per row.
        """
        if self.error is not None:
            return list(lines)
        out: list[bytes] = []
        append = out.append
        rx_num = self._rx_num.fullmatch
        rx_str = self._rx_str.fullmatch if self._rx_str is not None else None
        tpl_num, tpl_str = self._tpl_num, self._tpl_str
        idx_num, idx_str = self._idx_num, self._idx_str
        ident_num, ident_str = self._identity_num, self._identity_str
        slow = self._slow
        for line in lines:
            if line[-1:] == b"\r":
                line = line[:-1]
            m = rx_num(line)
            if m is not None:
                g = m.groups()
                append(tpl_num % (g if ident_num else tuple([g[j] for j in idx_num])))
                continue
            if rx_str is not None:
                m = rx_str(line)
                if m is not None:
                    g = m.groups()
                    append(tpl_str % (g if ident_str else tuple([g[j] for j in idx_str])))
                    continue
            append(slow(line))
        return out

    @staticmethod
    def _number(cell: str, integer: bool) -> Any:
        cell = cell.strip()
        if integer and cell.lower() in ("true", "false"):
            return 1 if cell.lower() == "true" else 0
        if not integer and _NUM_RE.fullmatch(cell.encode("ascii", "replace")):
            return _Raw(cell)
        try:
            v = float(cell)
        except ValueError:
            return cell  # a string where a number belongs: the decoder rejects it (bad_type)
        if v != v:
            return _Raw("NaN")  # non-finite: rejected by the decoder as non_finite
        if v in (float("inf"), float("-inf")):
            return _Raw("Infinity" if v > 0 else "-Infinity")
        if integer and v.is_integer():
            return int(v)  # "1.0" -> 1, as calmon check reads CSV labels
        return _Raw(repr(v))

    def _slow(self, line: bytes) -> bytes:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            return line
        if text.startswith("\ufeff"):
            text = text[1:]
        try:
            row = split_line(text)
        except csv.Error:
            return line
        if len(row) != self.ncols:
            return line
        obj: dict[str, Any] = {}
        for i, key, kind in self.cols:
            cell = row[i]
            if cell.strip() == "":
                continue
            if kind == "str":
                obj[key] = cell
            elif kind == "ts":
                v = self._number(cell, False)
                obj[key] = v if isinstance(v, _Raw) else cell.strip()
            else:
                obj[key] = self._number(cell, kind == "int")
        if self.prob_idx:
            cells = [row[i] for i in self.prob_idx]
            if any(c.strip() for c in cells):
                obj["probs"] = [self._number(c, False) if c.strip() else None for c in cells]
        return _dumps(obj)


class _Raw(str):
    """A validated JSON number literal, written as is."""


def _dumps(obj: dict[str, Any]) -> bytes:
    def enc(v: Any) -> str:
        if isinstance(v, _Raw):
            return str.__str__(v)
        if isinstance(v, list):
            return "[" + ",".join(enc(x) for x in v) + "]"
        return json.dumps(v)

    return ("{" + ",".join(f"{json.dumps(k)}:{enc(v)}" for k, v in obj.items()) + "}").encode("utf-8")
