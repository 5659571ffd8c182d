"""Splitting and validating Kafka configuration: calmon's own options versus the client library's.

kafka-python options are checked against the client's ``DEFAULT_CONFIG`` (so a misspelt
``sasl_mechansim`` is an error, not a silent fall-back to PLAINTEXT); librdkafka options (the
confluent-kafka client) must use dotted names.  Options calmon sets itself cannot be overridden.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ClientKind = Literal["consumer", "producer", "admin"]

#: Options of a source that calmon interprets (everything else belongs to the client library).
SOURCE_KEYS = frozenset(
    {"name", "group_id", "position_policy", "auto_offset_reset", "backoff_initial", "backoff_max", "origins",
     "metadata", "on_revoke", "reader"}
)
LIBRARIES = ("kafka-python", "confluent")
#: Where a source's client library runs (``reader``): see :class:`~connectors.kafka.source.KafkaSource`.
READERS = ("auto", "process", "inline")
#: kafka-python producer options calmon sets itself (dead letters and calibrators are raw bytes).
FORCED_PRODUCER = frozenset({"bootstrap_servers", "key_serializer", "value_serializer"})


def client_keys(kind: ClientKind) -> set[str]:
    """Option names a kafka-python client of ``kind`` understands.

    Examples
    --------
    >>> "security_protocol" in client_keys("producer")
    True
    """
    if kind == "consumer":
        from kafka import KafkaConsumer

        return set(KafkaConsumer.DEFAULT_CONFIG)
    if kind == "producer":
        from kafka import KafkaProducer

        return set(KafkaProducer.DEFAULT_CONFIG)
    from kafka.admin import KafkaAdminClient

    return set(KafkaAdminClient.DEFAULT_CONFIG)


def check_client(client: Mapping[str, Any] | None, kind: ClientKind, forced: Iterable[str] = ()) -> dict[str, Any]:
    """Validate kafka-python pass-through options (security, timeouts, ...); return a copy.

    Examples
    --------
    >>> check_client({"acks": "all"}, "producer")
    {'acks': 'all'}
    >>> check_client({"group_id": "x"}, "producer")
    Traceback (most recent call last):
    ...
    ValueError: unknown kafka-python producer option(s) ['group_id']; see the kafka-python producer documentation
    """
    client = dict(client or {})
    known = client_keys(kind)
    bad = sorted(k for k in client if k not in known)
    if bad:
        raise ValueError(f"unknown kafka-python {kind} option(s) {bad}; see the kafka-python {kind} documentation")
    clash = sorted(k for k in client if k in set(forced))
    if clash:
        raise ValueError(f"kafka-python option(s) {clash} are set by calmon and cannot be overridden")
    return client


def common_options(client: Mapping[str, Any], kind: ClientKind) -> dict[str, Any]:
    """The subset of ``client`` a kafka-python client of ``kind`` understands (security, client_id, ...).

    Examples
    --------
    >>> common_options({"acks": "all", "security_protocol": "SSL"}, "consumer")
    {'security_protocol': 'SSL'}
    """
    known = client_keys(kind)
    return {k: v for k, v in client.items() if k in known}


def check_librdkafka(client: Mapping[str, Any] | None, forced: Iterable[str]) -> dict[str, Any]:
    """Validate librdkafka (confluent-kafka) pass-through options; return a copy.

    Examples
    --------
    >>> check_librdkafka({"security.protocol": "SSL"}, {"group.id"})
    {'security.protocol': 'SSL'}
    >>> check_librdkafka({"security_protocol": "SSL"}, ())
    Traceback (most recent call last):
    ...
    ValueError: librdkafka options use dotted names (e.g. 'security.protocol'), got ['security_protocol']
    """
    client = dict(client or {})
    clash = sorted(k for k in client if k in set(forced))
    if clash:
        raise ValueError(f"librdkafka option(s) {clash} are set by calmon and cannot be overridden")
    bad = sorted(k for k in client if not isinstance(k, str) or "_" in k)
    if bad:
        raise ValueError(f"librdkafka options use dotted names (e.g. 'security.protocol'), got {bad}")
    return client


@dataclass
class SourceConfig:
    """A source's config mapping split into its parts (see :func:`split_source_config`)."""

    bootstrap_servers: str | list[str]
    topics: list[str]
    library: str | None
    own: dict[str, Any] = field(default_factory=dict)
    client: dict[str, Any] = field(default_factory=dict)
    rest: dict[str, Any] = field(default_factory=dict)


def confluent_installed() -> bool:
    """Whether confluent-kafka can be imported (without importing it)."""
    return importlib.util.find_spec("confluent_kafka") is not None


def pick_library(split: SourceConfig, confluent: bool | None = None) -> str:
    """The client library of a source whose config names none: confluent-kafka when it is installed
    (``confluent``: whether it is; default: look), unless the client options are kafka-python's.

    Client options tell the library apart: librdkafka's are dotted (``security.protocol``), kafka-python's use
    underscores (``security_protocol``); options of both kinds are an error naming them.

    Examples
    --------
    >>> c = split_source_config({"bootstrap_servers": "h:1", "topic": "t", "group_id": "g"})
    >>> pick_library(c, confluent=True), pick_library(c, confluent=False)
    ('confluent', 'kafka-python')
    >>> pick_library(split_source_config({"bootstrap_servers": "h:1", "topic": "t", "fetch.wait.max.ms": 50}), False)
    'confluent'
    >>> pick_library(split_source_config({"bootstrap_servers": "h:1", "topic": "t", "ssl_cafile": "ca"}), True)
    'kafka-python'
    """
    if split.library is not None:
        return split.library
    keys = [str(k) for k in (*split.client, *split.rest)]
    ours = sorted(k for k in keys if "_" in k)
    theirs = sorted(k for k in keys if "_" not in k and "." in k)
    if ours and theirs:
        raise ValueError(f"library: options {theirs} are librdkafka's (confluent) and {ours} kafka-python's; "
                         "use one kind and set library")
    if ours:
        return "kafka-python"
    if theirs:
        return "confluent"  # confluent-kafka missing: the adapter says so when it starts
    return "confluent" if (confluent_installed() if confluent is None else confluent) else "kafka-python"


def split_source_config(cfg: Mapping[str, Any]) -> SourceConfig:
    """Split a source's config into bootstrap servers, topics, library, calmon's options, ``client`` and the rest.

    Examples
    --------
    >>> c = split_source_config({"type": "kafka", "bootstrap_servers": "h:1", "prediction_topic": "p",
    ...     "outcome_topic": "o", "group_id": "g", "client": {"a": 1}, "ssl_cafile": "ca.pem"})
    >>> c.topics, c.own, c.client, c.rest
    (['p', 'o'], {'group_id': 'g'}, {'a': 1}, {'ssl_cafile': 'ca.pem'})
    """
    cfg = dict(cfg)
    cfg.pop("type", None)
    library = cfg.pop("library", None)
    if library is not None and library not in LIBRARIES:
        raise ValueError(f"library must be 'kafka-python' or 'confluent', got {library!r}")
    if "bootstrap_servers" not in cfg:
        raise ValueError("kafka source config needs 'bootstrap_servers'")
    bootstrap = cfg.pop("bootstrap_servers")
    topics: list[str] = []
    for k in ("topics", "topic", "prediction_topic", "outcome_topic"):
        if k in cfg:
            t = cfg.pop(k)
            topics += [t] if isinstance(t, str) else list(t)
    if not topics:
        raise ValueError("kafka source config needs 'topics', 'topic' or 'prediction_topic'/'outcome_topic'")
    own = {k: cfg.pop(k) for k in list(cfg) if k in SOURCE_KEYS}
    client = dict(cfg.pop("client", None) or {})
    return SourceConfig(bootstrap, list(dict.fromkeys(topics)), library, own, client, cfg)


def check_source_options(
    topics: str | list[str],
    bootstrap_servers: str | list[str],
    position_policy: str,
    auto_offset_reset: str,
    backoff: tuple[float, float],
) -> list[str]:
    """Validate a source's own constructor arguments; return the topics as a list.

    Examples
    --------
    >>> check_source_options("t", "h:1", "max", "earliest", (0.5, 30.0))
    ['t']
    """
    topics = [topics] if isinstance(topics, str) else list(topics)
    if not topics or not all(isinstance(t, str) and t for t in topics):
        raise ValueError(f"topics must be a non-empty list of topic names, got {topics!r}")
    if not bootstrap_servers:
        raise ValueError("bootstrap_servers must name at least one 'host:port'")
    if position_policy not in ("max", "checkpoint"):
        raise ValueError(f"position_policy must be 'max' or 'checkpoint', got {position_policy!r}")
    if auto_offset_reset not in ("earliest", "latest"):
        raise ValueError(f"auto_offset_reset must be 'earliest' or 'latest', got {auto_offset_reset!r}")
    if not (0 < backoff[0] <= backoff[1]):
        raise ValueError("need 0 < backoff_initial <= backoff_max")
    return topics
