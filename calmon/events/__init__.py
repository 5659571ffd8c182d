"""Records -> typed events: the decoder (:mod:`~calmon.events.decoder`), its per-record checks, the
per-model rows it cuts, and schema mappings for events of a foreign shape."""
