"""Binned sufficient statistics: additive, exactly mergeable, serialisable without pickle."""

from calmon.stats.grid import ScoreGrid
from calmon.stats.model import ModelStats
from calmon.stats.reservoir import Reservoir

__all__ = ["ModelStats", "Reservoir", "ScoreGrid"]
