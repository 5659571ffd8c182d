"""Where published calibrators go: the :class:`Publisher` protocol and the versioned :class:`DirectoryStore`."""

from __future__ import annotations

import json
import os
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from calmon.calibration.base import FORMAT, Calibrator, CalibratorError
from calmon.calibration.document import from_document
from calmon.formats.jsonio import fsync_dir, write_bytes_atomic

__all__ = ["Publisher", "DirectoryStore"]


@runtime_checkable
class Publisher(Protocol):
    """Where published calibrators go (a directory, a Kafka compacted topic keyed by model, ...).

    Only ``publish`` is required: :func:`calmon.calibration.refresh.refresh` calls ``latest_revision``
    and ``load`` when a publisher has them, and records a publisher that raises instead of failing the refresh
    (``connectors.kafka.KafkaCalibratorPublisher`` fits as is).
    """

    def publish(self, model: str, document: dict[str, Any]) -> dict[str, Any] | None:
        """Publish ``document`` (a calibrator document with ``revision`` and ``model``); return facts
        about where it went (JSON-able), or None.

        Optional: ``latest_revision(model) -> int | None`` (the highest revision it knows) and
        ``load(model) -> Calibrator | None`` (the calibrator in service)."""


def _model_dir(model: str) -> str:
    safe = urllib.parse.quote(model, safe="-_.")
    if safe in ("", ".", ".."):
        raise ValueError(f"invalid model name {model!r}")
    return safe


class DirectoryStore:
    """Versioned calibrator store in a directory: ``ROOT/<model>/rev-000001.json`` plus ``latest.json``.

    Each revision is written to a temporary file in the same directory, fsynced and hard-linked to
    its final name (so an existing revision is never overwritten, and readers see whole files only);
    ``latest.json`` is then replaced atomically (:func:`calmon.formats.jsonio.write_bytes_atomic`), and the
    directory is fsynced after both so that a crash cannot forget a published revision.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> from calmon.calibration import make_calibrator
    >>> store = DirectoryStore(tempfile.mkdtemp())
    >>> cal = make_calibrator("platt").fit(np.array([0.2, 0.4, 0.6, 0.8]), np.array([0, 1, 0, 1]))
    >>> doc = cal.to_document(); doc.update(model="m", revision=1)
    >>> store.publish("m", doc)["revision"], store.latest_revision("m")
    (1, 1)
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _dir(self, model: str) -> Path:
        return self.root / _model_dir(model)

    def revisions(self, model: str) -> list[int]:
        d = self._dir(model)
        if not d.is_dir():
            return []
        out = []
        for p in d.glob("rev-*.json"):
            try:
                out.append(int(p.stem[4:]))
            except ValueError:
                continue
        return sorted(out)

    def latest_revision(self, model: str) -> int | None:
        revs = self.revisions(model)
        return revs[-1] if revs else None

    def path(self, model: str, revision: int) -> Path:
        return self._dir(model) / f"rev-{int(revision):06d}.json"

    def publish(self, model: str, document: dict[str, Any]) -> dict[str, Any]:
        """Write ``document`` as revision ``document["revision"]`` and point ``latest.json`` at it.

        Raises
        ------
        ValueError
            The revision already exists (it is never overwritten).
        """
        revision = int(document["revision"])
        d = self._dir(model)
        d.mkdir(parents=True, exist_ok=True)
        final = self.path(model, revision)
        data = (json.dumps(document, indent=2, allow_nan=False) + "\n").encode()
        _write_new_file(final, data, f"revision {revision} of model {model!r}")
        write_bytes_atomic(d / "latest.json", data)
        return {"publisher": "directory", "revision": revision, "path": str(final)}

    def load_document(self, model: str, revision: int | None = None) -> dict[str, Any] | None:
        """The document of ``revision`` (default the latest), or None if the model has none."""
        rev = self.latest_revision(model) if revision is None else revision
        if rev is None:
            return None
        doc = json.loads(self.path(model, rev).read_text(encoding="utf-8"))
        if doc.get("format") != FORMAT:
            raise CalibratorError(f"{self.path(model, rev)} is not a calibrator document")
        return doc

    def load(self, model: str, revision: int | None = None) -> Calibrator | None:
        """The calibrator of ``revision`` (default the latest), or None."""
        doc = self.load_document(model, revision)
        return None if doc is None else from_document(doc)


def _write_new_file(final: Path, data: bytes, what: str) -> None:
    """Create ``final`` with ``data`` whole or not at all, refusing to overwrite it.

    The bytes go to a fsynced temporary file that is hard-linked to ``final`` (``link`` fails if
    the name exists, where ``rename`` would replace it); then the directory is fsynced.
    """
    fd, tmp = tempfile.mkstemp(prefix=".rev.", suffix=".tmp", dir=final.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, final)
        except FileExistsError:
            raise ValueError(f"{what} already exists at {final}") from None
        except OSError:  # file systems without hard links: check, then rename (not race-free)
            if os.path.lexists(final):  # anything at all, a dangling symbolic link included
                raise ValueError(f"{what} already exists at {final}") from None
            os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    fsync_dir(final.parent)
