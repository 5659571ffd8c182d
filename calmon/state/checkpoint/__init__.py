"""The checkpoint: its store, packs, incremental writer and document schema."""
