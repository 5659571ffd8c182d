"""Builders: the configuration's sources, sinks, publishers and alert rules as objects.

Everything a configuration can name is constructed here, so a mistake in it fails at start
with a :class:`StartupError` (one line naming the key) instead of in the middle of a round.
"""

from __future__ import annotations

from pathlib import Path

from calmon.alerts import AlertEngine, AlertmanagerClient, validate_rules
from calmon.calibration.refresh import DirectoryStore, Publisher
from calmon.config import AlertsConfig, Config, ConfigError, ExporterConfig, SourceConfig
from calmon.events.schema import FIELDS, Mapping
from calmon.exporter.http import Endpoints, HTTPExporter, HTTPLimits, tls_context
from connectors.base import DeadLetterSink, Source

__all__ = ["StartupError", "build_alert_engine", "build_alertmanager", "build_dead_letter",
           "build_publishers", "build_source", "start_exporter"]


class StartupError(RuntimeError):
    """The agent cannot start (bad checkpoint, unusable source...): one line, exit code 2."""


def start_exporter(ex: ExporterConfig, endpoints: Endpoints) -> HTTPExporter:
    """Serve ``endpoints`` where ``exporter`` says (address, port, TLS, basic auth, connection limits)."""
    tls = tls_context(ex.tls.cert_file, ex.tls.key_file, ex.tls.client_ca_file) if ex.tls.cert_file else None
    auth = (ex.basic_auth.username, ex.basic_auth.resolved_password()) if ex.basic_auth.username else None
    try:
        limits = HTTPLimits(ex.header_timeout, ex.idle_timeout, ex.max_connections)
        return HTTPExporter(endpoints, ex.address, ex.port, tls=tls, basic_auth=auth, limits=limits).start()
    except OSError as exc:
        raise StartupError(f"exporter: cannot listen on {ex.address}:{ex.port}: {exc.strerror or exc}") from None


def build_source(scfg: SourceConfig, index: int | None = None, max_record_bytes: int | None = None) -> Source:
    """Construct the connector of a :class:`~calmon.config.SourceConfig` (``index``: its place in ``sources``).

    An unknown or mistyped option raises :class:`StartupError` naming the key, e.g.
    ``sources.0.options: FileSource.__init__() got an unexpected keyword argument 'x'``.
    """
    where = f"sources.{scfg.name if index is None else index}"
    try:
        if scfg.type == "file":
            from connectors.files import FileSource
            assert scfg.path is not None  # validated by the config
            opts = dict(scfg.options)
            if max_record_bytes is not None:  # limits.max_record_bytes, unless the source sets its own
                opts.setdefault("max_line_bytes", max_record_bytes)
            mapping = scfg.mapping(where)
            if mapping is not None and _reads_metadata(mapping):
                raise StartupError(f"{where}.schema: $timestamp, $key and $headers exist only on Kafka sources")
            if mapping is not None:  # CSV/Parquet rows keep their column names; Parquet reads only these
                opts.setdefault("schema_columns", "all" if mapping.columns is None else sorted(mapping.columns))
            return FileSource(scfg.path, format=scfg.format, follow=scfg.follow, name=scfg.name, **opts)
        if scfg.type == "kafka":
            from connectors.kafka import KafkaSource
            opts = {**scfg.options, "name": scfg.name}
            mapping = scfg.mapping(where)
            if mapping is not None and _reads_metadata(mapping):  # metadata costs 30-60 % of the read path
                opts.setdefault("metadata", True)
            return KafkaSource.from_config(opts)
        from connectors.simsource import SimulatedSource
        return SimulatedSource(name=scfg.name, **scfg.options)
    except TypeError as exc:  # an unknown keyword in ``options``
        raise StartupError(f"{where}.options: {exc}") from None
    except (ValueError, OSError) as exc:
        raise StartupError(f"{where}: {exc}") from None


def build_dead_letter(cfg: Config) -> DeadLetterSink | None:
    """Construct the dead-letter sink (``None`` for ``type: none``)."""
    dl = cfg.dead_letter
    try:
        if dl.type == "none":
            return None
        if dl.type == "file":
            from connectors.deadletter import FileDeadLetterSink
            path = Path(dl.path)
            if not path.is_absolute():
                path = Path(cfg.state_dir) / path
            return FileDeadLetterSink(path, **dl.options)
        from connectors.kafka import KafkaDeadLetterSink
        return KafkaDeadLetterSink.from_config(dl.options)
    except TypeError as exc:
        raise StartupError(f"dead_letter.options: {exc}") from None
    except (ValueError, OSError) as exc:
        raise StartupError(f"dead_letter: {exc}") from None


def build_publishers(cfg: Config) -> list[Publisher]:
    """The calibrator publishers of ``recalibration.publishers`` (default: one directory store)."""
    rc = cfg.recalibration
    default_dir = rc.options.store_dir if rc.options.store_dir is not None else str(Path(cfg.state_dir) / "calibrators")
    out: list[Publisher] = []
    for i, p in enumerate(rc.publishers or []):
        where = f"recalibration.publishers.{i}"
        try:
            if p.type == "directory":
                out.append(DirectoryStore(p.options.get("path", default_dir)))
            else:
                from connectors.kafka import KafkaCalibratorPublisher
                out.append(KafkaCalibratorPublisher.from_config(p.options))
        except (TypeError, ValueError, OSError) as exc:
            raise StartupError(f"{where}.options: {exc}") from None
    return out or [DirectoryStore(default_dir)]


def build_alert_engine(cfg: AlertsConfig) -> AlertEngine | None:
    """The rule engine, or ``None`` without rules; bad rules raise :class:`ConfigError` naming the rule key."""
    if not (cfg.enabled and cfg.rules):
        return None
    try:
        rules = validate_rules(cfg.rules, "alerts.rules")
    except ValueError as exc:
        where, _, why = str(exc).partition(": ")
        raise ConfigError(where if why else "alerts.rules", why or str(exc)) from None
    return AlertEngine(rules)


def build_alertmanager(cfg: AlertsConfig) -> AlertmanagerClient | None:
    """The Alertmanager client of ``alerts.alertmanager`` (``None`` while its ``url`` is empty)."""
    am = cfg.alertmanager
    if not (cfg.enabled and am.url):
        return None
    try:
        return AlertmanagerClient(am.url, timeout=am.timeout, firing_ttl=am.firing_ttl,
                                  generator_url=am.generator_url, headers=am.headers,
                                  external_labels=am.external_labels)
    except ValueError as exc:
        raise ConfigError("alerts.alertmanager", str(exc)) from None


def _reads_metadata(mapping: Mapping) -> bool:
    """Whether a mapping reads transport metadata (``$timestamp``, ``$key``, ``$headers.NAME``)."""
    return any(mapping.source(f).kind == "meta" for f in FIELDS)
