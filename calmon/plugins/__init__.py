"""Name -> object registries that refuse duplicates under a lock (testers, calibrators)."""
