"""The ``calmon`` subcommands, one module each, and the one-line summary of each.

The summaries live here, not in the command modules, so that ``calmon --help`` can list every command without
importing any of them (``calmon check`` alone pulls in scipy and the testers).
"""

from __future__ import annotations

#: Command name -> its one-line summary, in the order ``calmon --help`` lists them.
SUMMARIES: dict[str, str] = {
    "run": "run the monitoring agent with a YAML configuration",
    "demo": "run the agent on a simulated stream with an injected calibration drift",
    "check": "report calibration metrics and tests of a file",
    "report": "write an HTML, PNG or SVG calibration report of a file",
    "simulate": "write a synthetic event stream (JSONL) with known miscalibration",
    "fit": "fit a recalibration map (Platt, isotonic, scaling-binning, ...) on a labeled file",
    "apply": "recalibrate a file's predictions with a calibrator document",
    "schema": "schema mappings for records of your own shape (suggest one)",
}
