"""The fuzz suite imports its harness (``fuzzkit``) from this directory."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
