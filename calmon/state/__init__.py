"""The agent's ingestion state: join, event-time windows, buckets, the fold, change monitors, counters,
the state lock, and the checkpoint format (:mod:`calmon.state.checkpoint`)."""
