"""calmon: a streaming calibration monitor for production machine learning."""

__version__ = "0.1.0"
