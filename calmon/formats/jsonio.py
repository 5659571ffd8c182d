"""JSON plumbing shared by every room: JSON-safe copies, packed arrays and atomic, durable writes.

One implementation of each, so that every document calmon writes (checkpoints, calibrators,
reports) is cleaned the same way and every file it replaces survives a crash: the bytes go to a
temporary file in the same directory, which is fsynced, renamed over the target with
``os.replace`` and followed by an fsync of the directory (without it a crash can forget the
rename on some file systems).

A writer replaces only a regular file, or creates a path that does not exist: a device (``-o
/dev/full``), fifo, socket or directory is refused with :class:`NotRegularFileError` and left as
it is, and so is a symbolic link, which is not followed (its target may be anything and anywhere;
point the writer at the file itself).  :func:`check_replaceable` is the test, made before the
temporary file is created and again just before the rename; it guards against mistakes, not
against a process racing the writer in the same directory.

Examples
--------
>>> import numpy as np, tempfile, pathlib, json
>>> clean({"a": float("nan"), "b": np.int64(3), "c": (1.5, np.array([1, 2]))})
{'a': None, 'b': 3, 'c': [1.5, [1, 2]]}
>>> a = np.array([[1, -2], [3, 2**40]], dtype=np.int64)
>>> bool(np.array_equal(unpack_array(pack_array(a), "<i8", (2, 2)), a))
True
>>> p = pathlib.Path(tempfile.mkdtemp()) / "sub" / "doc.json"
>>> write_json_atomic(p, {"x": 1})
>>> json.loads(p.read_text())
{'x': 1}
"""

from __future__ import annotations

import base64
import json
import math
import os
import stat
import tempfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["NotRegularFileError", "check_replaceable", "clean", "fsync_dir", "pack_array", "unpack_array",
           "write_bytes_atomic", "write_json_atomic"]


#: Types returned as they are (exact types: a subclass such as ``np.float64`` takes the general path).
_PLAIN = frozenset({str, int, bool, type(None)})


def clean(x: Any) -> Any:
    """JSON-safe deep copy: non-finite floats become ``None``; numpy scalars and arrays, tuples and
    sets become plain Python; dict keys become strings.

    Plain dicts and lists are copied with their plain leaves inline (no call per string, int or
    finite float: ``v - v == 0.0`` is false exactly for NaN and infinities), which makes cleaning an
    already clean document several times cheaper; anything else goes through :func:`_clean_other`.

    Examples
    --------
    >>> clean({1: [0.5, float("inf"), "a", None, True, {"b": float("-inf")}]})
    {'1': [0.5, None, 'a', None, True, {'b': None}]}
    """
    t = type(x)
    if t is dict:  # floats tested first: most leaves of a document are
        return {k if type(k) is str else _key(k):
                v if ((tv := type(v)) is float and v - v == 0.0) or tv in _PLAIN else clean(v)
                for k, v in x.items()}
    if t is list:
        return [v if ((tv := type(v)) is float and v - v == 0.0) or tv in _PLAIN else clean(v) for v in x]
    if t is float:
        return x if x - x == 0.0 else None
    if t in _PLAIN:
        return x
    return _clean_other(x)


def _key(k: Any) -> str:
    return k if isinstance(k, str) else str(k)


def _clean_other(x: Any) -> Any:
    """:func:`clean` of anything but a plain dict, list, float, str, int, bool or ``None``."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {_key(k): clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set | frozenset):
        return [clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return clean(x.tolist())
    if isinstance(x, np.generic):
        return clean(x.item())
    if isinstance(x, Path):
        return str(x)
    return x


def pack_array(a: np.ndarray, dtype: str = "<i8", level: int = 6) -> dict[str, Any]:
    """A pickle-free JSON form of an array: little-endian bytes, zlib-compressed, in base64."""
    raw = np.ascontiguousarray(a, dtype=dtype).tobytes()
    packed = base64.b64encode(zlib.compress(raw, level)).decode()
    return {"dtype": dtype, "shape": list(np.shape(a)), "zlib_b64": packed}


def unpack_array(d: Any, dtype: str = "<i8", shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Inverse of :func:`pack_array`; checks dtype and (if given) shape, raising ``ValueError``."""
    if not isinstance(d, dict) or d.get("dtype") != dtype or not isinstance(d.get("zlib_b64"), str):
        got = d.get("dtype") if isinstance(d, dict) else type(d).__name__
        raise ValueError(f"packed array has dtype {got!r}, expected {dtype!r}")
    want = tuple(int(s) for s in d.get("shape", ()))
    if shape is not None and want != tuple(shape):
        raise ValueError(f"packed array has shape {list(want)}, expected {list(shape)}")
    try:
        raw = zlib.decompress(base64.b64decode(d["zlib_b64"], validate=True))
    except (ValueError, zlib.error) as exc:
        raise ValueError(f"packed array is corrupt: {exc}") from None
    out = np.frombuffer(raw, dtype=dtype)
    if out.size != math.prod(want):
        raise ValueError(f"packed array holds {out.size} values, shape {list(want)} needs {math.prod(want)}")
    return out.reshape(want).astype(np.dtype(dtype).newbyteorder("="))


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that a rename in it is durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class NotRegularFileError(OSError):
    """A writer was pointed at something it must not replace: ``str(err)`` is one line naming it."""


#: What a file type is called in a refusal (``stat.S_IFMT`` -> name).
_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a fifo",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link"}


def check_replaceable(path: str | os.PathLike[str]) -> None:
    """Raise :class:`NotRegularFileError` unless ``path`` does not exist or is a regular file.

    A symbolic link is refused, not followed (``os.lstat``).

    Examples
    --------
    >>> check_replaceable("/nonexistent/calmon/doc.json")
    >>> try:
    ...     check_replaceable("/dev/null")
    ... except NotRegularFileError as err:
    ...     print(err)
    refusing to replace /dev/null: it is a character device, not a regular file
    """
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "a special file")
        raise NotRegularFileError(f"refusing to replace {os.fspath(path)}: it is {kind}, not a regular file")


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically and durably (temp file, fsync, rename, fsync directory).

    Raises :class:`NotRegularFileError` (an ``OSError``) if ``path`` exists and is not a regular file
    (see :func:`check_replaceable`); nothing is written then.
    """
    p = Path(path)
    check_replaceable(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        check_replaceable(p)  # again: the path may have changed while the bytes were written
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(p.parent)


def write_json_atomic(path: str | os.PathLike[str], doc: Any, *, indent: int | None = 2) -> None:
    """Write ``clean(doc)`` as JSON (strict: no NaN) to ``path`` with :func:`write_bytes_atomic`."""
    text = json.dumps(clean(doc), indent=indent, allow_nan=False)
    write_bytes_atomic(path, (text + "\n").encode("utf-8"))
