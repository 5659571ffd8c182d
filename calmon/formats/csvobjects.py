"""CSV rows as JSON objects keyed by the header's names, for schema mappings (``prediction_id,p,y``).

Without a mapping, CSV columns must be named as calmon's fields (:mod:`calmon.formats.csvrows`); with one, a row
keeps the user's column names and :class:`calmon.events.decoder.Decoder` applies the mapping, as it does to a
JSON Lines record. A cell written as a JSON number becomes a number (``1``, ``0.25``, ``1e-3``), ``true`` and
``false`` (any case, as pandas writes ``True``) become booleans (a boolean label is 1 or 0), any
other cell a string, and an empty cell is left out. A row that is not valid CSV or not UTF-8 is passed
on as it is (the decoder rejects it as ``not_json``) and never raises.

Examples
--------
>>> c = CsvObjects(b"prediction_id,p,y")
>>> [r.decode() for r in c.convert([b"a1,0.25,yes", b'a2,,"1"', b"a3,0.5"])]
['{"prediction_id":"a1","p":0.25,"y":"yes"}', '{"prediction_id":"a2","y":1}', 'a3,0.5']
"""

from __future__ import annotations

import csv
import re

import msgspec

from calmon.formats.csvrows import split_line

__all__ = ["CsvObjects", "cell_value"]

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?\Z")
_ENCODE = msgspec.json.Encoder().encode


_BOOLEANS = {"true": True, "false": False}


def cell_value(v: str) -> str | int | float | bool:
    """A CSV cell as a JSON value: a number when it is written as a JSON number, a boolean for ``true``/``false``
    (any case), else the string.

    >>> cell_value("1"), cell_value("0.5"), cell_value("1e3"), cell_value("01"), cell_value("yes"), cell_value("True")
    (1, 0.5, 1000.0, '01', 'yes', True)
    """
    if _NUMBER.match(v):
        return int(v) if v.lstrip("-").isdigit() else float(v)
    if len(v) in (4, 5):
        b = _BOOLEANS.get(v.lower())
        if b is not None:
            return b
    return v


class CsvObjects:
    """Convert CSV rows (bytes, one line each) into JSON objects keyed by the header's names.

    Parameters
    ----------
    header
        The header line (bytes, without newline; a UTF-8 byte-order mark is ignored).
    """

    def __init__(self, header: bytes) -> None:
        self.error: str | None = None
        try:
            self.names = [c.strip() for c in split_line(header.decode("utf-8").removeprefix("\ufeff"))]
        except (UnicodeDecodeError, csv.Error) as exc:
            self.names, self.error = [], f"header is not UTF-8 CSV: {exc}"
        if not self.error and (not self.names or len(set(self.names)) < len(self.names)):
            self.error = "header is empty or repeats a column name"

    def convert(self, lines: list[bytes]) -> list[bytes]:
        """One record per row, in order (see the module docstring)."""
        if self.error is not None:
            return list(lines)
        out = []
        for line in lines:
            out.append(self.row(line))
        return out

    def row(self, line: bytes) -> bytes:
        try:
            cells = split_line(line.rstrip(b"\r").decode("utf-8"))
        except (UnicodeDecodeError, csv.Error):
            return line
        if len(cells) != len(self.names):
            return line
        return _ENCODE({k: cell_value(v) for k, v in zip(self.names, cells) if v != ""})
