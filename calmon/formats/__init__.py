"""Bytes <-> records: the raw-record contract (:mod:`~calmon.formats.records`), compressed streams,
CSV and Parquet rows, JSON plumbing and atomic writes. Imports nothing of calmon."""
