"""The long-running agent: join, event-time windows, scheduler and runtime (``calmon run``)."""
