"""What :func:`calmon.offline.inputs.read_input` returns: a :class:`Dataset` of labeled predictions, or an
:class:`InputError`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Dataset", "InputError"]


class InputError(ValueError):
    """Bad input: the message is one line naming the file, line and field."""


@dataclass
class Dataset:
    """Labeled predictions read from a file.

    ``z``/``y`` are the binary score and label, or for multiclass the top-label confidence
    and correctness; ``probs``/``labels`` are set for multiclass inputs.
    """

    source: str
    classes: int
    z: np.ndarray
    y: np.ndarray
    probs: np.ndarray | None = None
    labels: np.ndarray | None = None
    ids: np.ndarray | None = None
    #: Event times (JSON Lines inputs; NaN where an event had none): the report's time view.
    ts: np.ndarray | None = None
    model: str | None = None
    top_label_only: bool = False
    #: Rows that are a prediction joined with its outcome by id (the others were labeled events or rows).
    joined: int = 0
    unjoined_predictions: int = 0
    orphan_outcomes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.z.size)

    @property
    def kind(self) -> str:
        if self.top_label_only:
            return "top-label"
        return "binary" if self.classes == 2 else "multiclass"
