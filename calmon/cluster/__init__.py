"""The partitioned agent on Kafka: an ingest stage and an evaluate stage, each a consumer group (issue #17).

One concept per module:

* :mod:`~calmon.cluster.deltas` -- the delta record (what one input range added to one model) and its merge;
* :mod:`~calmon.cluster.topics` -- the internal topics: per-partition states, the producer and the
  ``read_committed`` readers;
* :mod:`~calmon.cluster.transactions` -- one Kafka transaction per range: the transactional producer of an
  input partition, which fences the partition's previous owner;
* :mod:`~calmon.cluster.partition` -- one input partition's buffered records and join state, range by range;
* :mod:`~calmon.cluster.ingest` -- the ingest worker (``calmon run --role ingest``);
* :mod:`~calmon.cluster.evaluate` -- the evaluator (``calmon run --role evaluate``), the agent fed by deltas;
* :mod:`~calmon.cluster.ownership` -- owned partitions and models, lag, as ``calmon_cluster_*`` metrics.

Design, exactly-once argument and runbook: ``docs/cluster.md``.
"""
