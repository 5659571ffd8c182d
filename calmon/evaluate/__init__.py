"""A snapshot of the state -> a typed round result: metrics, tester scheduling and pool, label-free
estimates, verdicts, recalibration."""
