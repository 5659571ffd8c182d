"""``calmon run``: wiring and threads -- builds sources, state, evaluator and exporter from the
configuration and runs ingestion, rounds and checkpoints."""
