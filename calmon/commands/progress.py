"""Progress of a command's steps on stderr (``calmon check``/``report``): not a command, their shared display.

Shown only when a person watches (stderr is a terminal): never in pipes, files or CI logs. With the
``progress`` extra (rich) it is a bar that disappears when the command ends; without it one plain status line,
rewritten in place and cleared at the end. rich is imported only when there is a terminal to draw on.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

__all__ = ["Steps"]


class Steps:
    """Progress of ``total`` steps: :meth:`start` names the current one, :meth:`done` advances.

    Examples
    --------
    >>> with Steps(2) as steps:   # doctest stderr is not a terminal: nothing is shown
    ...     steps.start("read"); steps.done()
    """

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self._stream = sys.stderr if stream is None else stream
        self._total, self._done, self._what = total, 0, ""
        isatty = getattr(self._stream, "isatty", None)
        self._shown = bool(isatty and isatty())
        self._rich: Any = None
        if self._shown:
            try:
                from rich.console import Console
                from rich.progress import Progress
            except ImportError:  # the plain line below
                return
            self._rich = Progress(console=Console(file=self._stream), transient=True)
            self._task = self._rich.add_task("calmon", total=total)

    def __enter__(self) -> Steps:
        if self._rich is not None:
            self._rich.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.stop()
        elif self._shown:
            self._stream.write("\r\033[K")  # clear the status line: the command's own output follows
            self._stream.flush()

    def start(self, description: str) -> None:
        self._what = description
        if self._rich is not None:
            self._rich.update(self._task, description=description)
        else:
            self._plain()

    def done(self, steps: int = 1) -> None:
        self._done = min(self._total, self._done + steps)
        if self._rich is not None:
            self._rich.advance(self._task, steps)
        else:
            self._plain()

    def _plain(self) -> None:
        if self._shown:
            self._stream.write(f"\r\033[Kcalmon: {self._what} ({self._done}/{self._total})")
            self._stream.flush()
