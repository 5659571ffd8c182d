"""The configuration schema: one dataclass per section, each validating itself with key paths."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from calmon.calibration.limits import RefreshLimits

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}


class ConfigError(ValueError):
    """A configuration problem; ``str(err)`` is ``"<key.path>: <reason>"``."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path or "<root>"
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class Duration(float):
    """Seconds, parsed from a number or a string such as ``"5m"`` (marker type for the schema)."""


def parse_duration(value: Any, path: str = "") -> float:
    """Seconds in ``value`` (a non-negative number or ``"<number><ms|s|m|h|d|w>"``).

    Parameters
    ----------
    value
        Number of seconds or a string with a unit.
    path
        Key path for the error message.

    Returns
    -------
    float
        The duration in seconds.

    Examples
    --------
    >>> parse_duration("5m"), parse_duration(90), parse_duration("1.5h")
    (300.0, 90.0, 5400.0)
    """
    if isinstance(value, bool):
        raise ConfigError(path, f"must be a duration like 30s, 5m, 1h, 7d, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        raise ConfigError(path, f"must be a duration like 30s, 5m, 1h, 7d, got {value!r}")
    if not seconds >= 0 or seconds == float("inf"):
        raise ConfigError(path, f"must be a finite non-negative duration, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Shortest exact label for a duration (``3600 -> "1h"``), used for window names.

    Examples
    --------
    >>> format_duration(3600), format_duration(300), format_duration(90)
    ('1h', '5m', '90s')
    """
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _check(cond: bool, path: str, reason: str) -> None:
    if not cond:
        raise ConfigError(path, reason)


# --------------------------------------------------------------------------------------------- schema
@dataclass
class SourceConfig:
    """One input: ``type: file`` (JSONL/CSV file or directory), ``kafka`` or ``simulate`` (the demo's)."""

    name: str = "events"
    type: Literal["file", "kafka", "simulate"] = "file"
    path: str | None = None
    format: Literal["auto", "jsonl", "csv", "parquet"] = "auto"
    follow: bool = False
    #: Extra keyword arguments for the connector's constructor (e.g. Kafka ``bootstrap_servers``, ``topics``).
    options: dict[str, Any] = field(default_factory=dict)
    #: Schema mapping of this source's records (a YAML/JSON file path or an inline mapping; see
    #: :mod:`calmon.events.schema`); ``None``: calmon's own schema.
    schema: Any = None

    def validate(self, path: str) -> None:
        _check(bool(re.fullmatch(r"[A-Za-z0-9_.:-]+", self.name)), f"{path}.name",
               f"must be a non-empty name of letters, digits, _ . : -, got {self.name!r}")
        if self.type == "file":
            _check(bool(self.path), f"{path}.path", "is required for a file source")
        if self.schema is not None:
            self.mapping(path)

    def mapping(self, path: str = "source") -> Any:
        """The validated :class:`calmon.events.schema.Mapping` of ``schema`` (``None`` without one); a bad mapping
        raises :class:`ConfigError` naming the key (``sources.0.schema.fields.x``)."""
        from calmon.events.schema import MappingError, load_mapping
        if self.schema is None:
            return None
        _check(isinstance(self.schema, str | dict), f"{path}.schema", "must be a file path or a mapping")
        try:
            return load_mapping(self.schema, where=f"{path}.schema")
        except MappingError as exc:
            where, _, why = str(exc).partition(": ")
            raise ConfigError(where, why) from None


@dataclass
class DeadLetterConfig:
    """Where rejected records go (with their reason): a JSONL file, a Kafka topic, or nowhere."""

    type: Literal["file", "kafka", "none"] = "file"
    #: File path; relative paths are resolved against ``state_dir``.
    path: str = "deadletter.jsonl"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelConfig:
    """Statistics kept per model (and per allow-listed segment)."""

    #: Number of classes (2 = binary ``score``); ``None`` = take it from the first event.
    classes: int | None = None
    #: Cells of the fine score grid (a power of two; every dyadic scale below is exact).
    bins: int = 1024
    #: Uniform sample kept per time bucket for testers that need raw vectors.
    reservoir: int = 256
    #: Level-set resolution lambda for the multiclass l_p statistics (``None`` = off).
    levelset_lambda: int | None = None
    #: Segment values that get their own windows (others count only in segment "all").
    segments: list[str] = field(default_factory=list)

    def validate(self, path: str) -> None:
        _check(self.classes is None or 2 <= self.classes <= 100_000, f"{path}.classes",
               f"must be null or an integer in [2, 100000] (and <= limits.max_classes), got {self.classes!r}")
        _check(self.bins >= 16 and self.bins & (self.bins - 1) == 0 and self.bins <= 2**16, f"{path}.bins",
               f"must be a power of two in [16, 65536], got {self.bins!r}")
        _check(0 <= self.reservoir <= 1_000_000, f"{path}.reservoir",
               f"must be in [0, 1e6], got {self.reservoir}")
        _check(self.levelset_lambda is None or self.levelset_lambda >= 1, f"{path}.levelset_lambda",
               f"must be null or a positive integer, got {self.levelset_lambda!r}")
        _check(len(set(self.segments)) == len(self.segments), f"{path}.segments", "has duplicate values")
        _check("all" not in self.segments, f"{path}.segments", "'all' is reserved for the whole stream")


@dataclass
class LimitsConfig:
    """Cardinality caps: events beyond them are rejected with a reason (``too_many_models``...)."""

    max_models: int = 50
    max_segments: int = 20
    #: Classes of a model, configured or inferred from its first event.
    max_classes: int = 1000
    #: A record (one JSON line, one Kafka message) longer than this is rejected (``too_large``) unread.
    max_record_bytes: int = 1_048_576
    #: Longest prediction id in bytes (``id_too_long``); the join buffers are bounded in bytes with it.
    max_id_bytes: int = 256
    #: Event times further ahead of the wall clock are rejected (``future_timestamp``) and never move the watermark.
    future_skew: Duration = Duration(3600.0)
    #: Event times further behind the wall clock are rejected (``past_timestamp``).
    past_horizon: Duration = Duration(10 * 365 * 86400.0)
    #: Bytes of the join buffers (ids, payloads) together; the oldest pending predictions are evicted beyond it.
    max_join_bytes: int = 512 * 1024 * 1024

    def validate(self, path: str) -> None:
        _check(1 <= self.max_models <= 10_000, f"{path}.max_models",
               f"must be in [1, 10000], got {self.max_models}")
        _check(1 <= self.max_segments <= 10_000, f"{path}.max_segments",
               f"must be in [1, 10000], got {self.max_segments}")
        _check(2 <= self.max_classes <= 100_000, f"{path}.max_classes",
               f"must be in [2, 100000], got {self.max_classes}")
        _check(64 <= self.max_record_bytes <= 1 << 30, f"{path}.max_record_bytes",
               f"must be in [64, 2^30], got {self.max_record_bytes}")
        _check(8 <= self.max_id_bytes <= 65_536, f"{path}.max_id_bytes",
               f"must be in [8, 65536], got {self.max_id_bytes}")
        _check(self.future_skew >= 0, f"{path}.future_skew", "must be >= 0")
        _check(self.past_horizon > 0, f"{path}.past_horizon", "must be positive")
        _check(self.max_join_bytes >= 1 << 20, f"{path}.max_join_bytes",
               f"must be >= 1 MiB, got {self.max_join_bytes}")


@dataclass
class JoinConfig:
    """Predictions wait for their outcome by id."""

    #: Event-time TTL: a prediction older than (newest event time - ttl) expires.
    ttl: Duration = Duration(3600.0)
    #: Memory bound on pending predictions per model (the oldest are evicted as expired).
    max_pending: int = 1_000_000

    def validate(self, path: str) -> None:
        _check(self.ttl > 0, f"{path}.ttl", "must be positive")
        _check(self.max_pending >= 1, f"{path}.max_pending", f"must be >= 1, got {self.max_pending}")


@dataclass
class TierConfig:
    """``count`` buckets of ``width`` seconds; each tier's width is a multiple of the previous one."""

    width: Duration = Duration(300.0)
    count: int = 12


@dataclass
class WindowsConfig:
    """Event-time buckets and the sliding windows summed from them."""

    #: Window lengths to evaluate and export (``all`` = everything since the state began).
    names: list[str] = field(default_factory=lambda: ["1h", "24h", "7d", "all"])
    #: Events older than (newest event time - allowed_lateness) are dropped and counted. Must be >= ``join.ttl``;
    #: when not set, a ``join.ttl`` above 7 days raises it to the TTL.
    allowed_lateness: Duration = Duration(7 * 86400.0)
    #: Ring of buckets, finest first; older data is merged into coarser buckets.
    tiers: list[TierConfig] = field(default_factory=lambda: [
        TierConfig(Duration(300.0), 12), TierConfig(Duration(3600.0), 24), TierConfig(Duration(86400.0), 7)])

    def validate(self, path: str) -> None:
        _check(len(self.tiers) >= 1, f"{path}.tiers", "needs at least one tier")
        prev = None
        for i, t in enumerate(self.tiers):
            _check(t.width > 0, f"{path}.tiers.{i}.width", "must be positive")
            _check(t.count >= 1, f"{path}.tiers.{i}.count", f"must be >= 1, got {t.count}")
            if prev is not None:
                ratio = t.width / prev.width
                _check(ratio >= 1 and abs(ratio - round(ratio)) < 1e-9, f"{path}.tiers.{i}.width",
                       f"must be a multiple of the previous tier's width {prev.width:g}s, got {t.width:g}s")
            prev = t
        _check(len(self.names) >= 1, f"{path}.names", "needs at least one window")
        _check(len(set(self.names)) == len(self.names), f"{path}.names", "has duplicates")
        span = self.span
        for i, name in enumerate(self.names):
            if name == "all":
                continue
            seconds = parse_duration(name, f"{path}.names.{i}")
            _check(0 < seconds <= span, f"{path}.names.{i}",
                   f"window {name!r} must be positive and at most the tiers' span {format_duration(span)}")

    @property
    def span(self) -> float:
        """Seconds of event time the ring holds."""
        return sum(t.width * t.count for t in self.tiers)

    def window_seconds(self) -> dict[str, float | None]:
        """Window name -> length in seconds (``None`` for ``all``)."""
        return {n: None if n == "all" else parse_duration(n) for n in self.names}


@dataclass
class TesterConfig:
    """One tester from the registry (:mod:`calmon.testers`) with extra keyword parameters."""

    __test__ = False  # not a pytest test class despite the name

    name: str = "tcal"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvaluationConfig:
    """The scheduler: every ``every`` seconds evaluate each (model, segment, window)."""

    every: Duration = Duration(60.0)
    #: Time budget of one round: metrics and cheap testers of every changed window, then as many scheduled
    #: tester calls as fit (stalest first); only cheap testers left when it is spent count as an overrun.
    budget: Duration = Duration(30.0)
    alpha: float = 0.05
    mc: int = 1000
    seed: int = 0
    #: Windows with fewer events report the metrics but not the testers ("insufficient data").
    min_events: int = 100
    #: Bins of the exported reliability diagram (labels ``bin="0.00"``...).
    reliability_bins: int = 20
    tests: list[TesterConfig] = field(default_factory=lambda: [TesterConfig("tcal"), TesterConfig("smce"),
                                                             TesterConfig("ldtc")])
    #: Testers run on every changed window every round; the others are scheduled work items.
    cheap: list[str] = field(default_factory=lambda: ["tcal"])
    #: A cheap tester measured slower than this per window is scheduled like the others.
    cheap_cost: Duration = Duration(0.05)
    #: Tester -> fewest rounds between two runs of a scheduled tester on one window (default 1).
    cadence: dict[str, int] = field(default_factory=dict)
    #: Where scheduled testers run: ``process`` (spawned workers, JSON in and out), ``thread`` or ``inline``.
    pool: str = "process"
    workers: int = 2

    def validate(self, path: str) -> None:
        _check(self.every > 0, f"{path}.every", "must be positive")
        _check(self.budget > 0, f"{path}.budget", "must be positive")
        _check(self.cheap_cost > 0, f"{path}.cheap_cost", "must be positive")
        configured = {t.name for t in self.tests}
        for name, rounds in self.cadence.items():
            _check(name in configured, f"{path}.cadence.{name}",
                   f"is not a configured tester ({', '.join(sorted(configured))})")
            _check(isinstance(rounds, int) and rounds >= 1, f"{path}.cadence.{name}",
                   f"must be an integer >= 1 (rounds), got {rounds!r}")
        _check(self.pool in ("inline", "thread", "process"), f"{path}.pool",
               f"must be one of inline, thread, process, got {self.pool!r}")
        _check(1 <= self.workers <= 64, f"{path}.workers", f"must be in [1, 64], got {self.workers}")
        _check(0 < self.alpha < 1, f"{path}.alpha", f"must lie in (0, 1), got {self.alpha}")
        # 1e6 is calmon.testers.MAX_MC (not imported here: it would load scipy with every configuration)
        _check(1 <= self.mc <= 1_000_000, f"{path}.mc", f"must be in [1, 1000000], got {self.mc}")
        _check(self.min_events >= 0, f"{path}.min_events", "must be >= 0")
        _check(self.reliability_bins in (5, 10, 20, 25, 50), f"{path}.reliability_bins",
               f"must be one of 5, 10, 20, 25, 50, got {self.reliability_bins}")
        names = [t.name for t in self.tests]
        _check(len(set(names)) == len(names), f"{path}.tests", "has duplicate tester names")


@dataclass
class TLSConfig:
    cert_file: str = ""
    key_file: str = ""
    #: CA bundle to require client certificates (mutual TLS); empty = no client certificates.
    client_ca_file: str = ""

    def validate(self, path: str) -> None:
        _check(bool(self.cert_file) == bool(self.key_file), path, "cert_file and key_file go together")
        for key in ("cert_file", "key_file", "client_ca_file"):
            value = getattr(self, key)
            _check(not value or Path(value).is_file(), f"{path}.{key}", f"file not found: {value}")


@dataclass
class BasicAuthConfig:
    username: str = ""
    password: str = ""
    #: Read the password from this file instead (e.g. a Kubernetes secret mount).
    password_file: str = ""

    def validate(self, path: str) -> None:
        _check(not (self.password and self.password_file), path, "give password or password_file, not both")
        if self.password_file:
            _check(Path(self.password_file).is_file(), f"{path}.password_file",
                   f"file not found: {self.password_file}")
        _check(bool(self.username) == bool(self.password or self.password_file), path,
               "username and a password (or password_file) go together")

    def resolved_password(self) -> str:
        if self.password_file:
            return Path(self.password_file).read_text().strip()
        return self.password


@dataclass
class ExporterConfig:
    """HTTP endpoint: /metrics (Prometheus), /healthz, /readyz, / (status page), /api/status (JSON)."""

    enabled: bool = True
    address: str = "127.0.0.1"
    port: int = 9464
    tls: TLSConfig = field(default_factory=TLSConfig)
    basic_auth: BasicAuthConfig = field(default_factory=BasicAuthConfig)
    #: A new connection's request head (request line and headers, TLS handshake included) must arrive within this.
    header_timeout: Duration = Duration(10.0)
    #: A keep-alive connection without a new request is closed after this.
    idle_timeout: Duration = Duration(60.0)
    #: Open connections at most; a new one beyond evicts the longest-idle one (or is refused if all are busy).
    max_connections: int = 64
    #: Windows whose reliability diagram (3 x reliability_bins series each) is exported: ``longest`` (the longest
    #: configured window: its bins hold the most events, so its diagram is the steadiest), all, none or "1h,24h".
    #: Every diagram is in /api/status whatever this says.
    reliability: str = "longest"
    #: Series budget of the per-window detail (see calmon/exporter/rounds.py): per (model, segment, window) for the
    #: headline metrics, tester results and estimates (tiers kept in that order), per model, and in total.
    max_series_per_window: int = 40
    max_series_per_model: int = 5000
    max_series: int = 200_000
    #: Label-free estimates exported per window: ``headline`` (point estimates, the accuracy interval and estimation
    #: error, score drift), ``full`` (every interval and estimation error) or ``none``; /api/status has them all.
    estimates: str = "headline"

    def validate(self, path: str) -> None:
        _check(0 <= self.port <= 65535, f"{path}.port", f"must be an integer in [0, 65535], got {self.port}")
        _check(0.01 <= self.header_timeout <= 600, f"{path}.header_timeout",
               f"must be in [10ms, 10m], got {self.header_timeout}")
        _check(0.01 <= self.idle_timeout <= 3600, f"{path}.idle_timeout",
               f"must be in [10ms, 1h], got {self.idle_timeout}")
        _check(1 <= self.max_connections <= 10_000, f"{path}.max_connections",
               f"must be in [1, 10000], got {self.max_connections}")
        _check(self.reliability in ("longest", "all", "none") or all(w.strip() for w in self.reliability.split(",")),
               f"{path}.reliability",
               f"must be longest, all, none or comma-separated window names, got {self.reliability!r}")
        _check(isinstance(self.max_series_per_window, int) and self.max_series_per_window >= 1,
               f"{path}.max_series_per_window", f"must be an integer >= 1, got {self.max_series_per_window!r}")
        _check(self.estimates in ("headline", "full", "none"), f"{path}.estimates",
               f"must be one of headline, full, none, got {self.estimates!r}")
        _check(self.max_series_per_model >= 1, f"{path}.max_series_per_model", "must be >= 1")
        _check(self.max_series >= 1, f"{path}.max_series", "must be >= 1")

    def reliability_windows(self, windows: WindowsConfig) -> str | tuple[str, ...]:
        """``reliability`` for the series budget: ``all``, ``none``, or the window names (``longest`` resolved
        against ``windows.names``, where the window ``all`` is the longest of all).

        Examples
        --------
        >>> ExporterConfig().reliability_windows(WindowsConfig(names=["1h", "7d", "24h"]))
        ('7d',)
        >>> ExporterConfig().reliability_windows(WindowsConfig())  # the window "all" alone
        ('all',)
        >>> ExporterConfig(reliability="all").reliability_windows(WindowsConfig())  # every window
        'all'
        >>> ExporterConfig(reliability="1h, 24h").reliability_windows(WindowsConfig())
        ('1h', '24h')
        """
        if self.reliability in ("all", "none"):
            return self.reliability
        if self.reliability != "longest":
            return tuple(w.strip() for w in self.reliability.split(","))
        length = {n: float("inf") if s is None else s for n, s in windows.window_seconds().items()}
        return (max(windows.names, key=length.__getitem__),)


@dataclass
class CheckpointConfig:
    enabled: bool = True
    every: Duration = Duration(30.0)
    #: Generations kept restorable (with the pack files they refer to).
    keep: int = 3

    def validate(self, path: str) -> None:
        _check(self.every > 0, f"{path}.every", "must be positive")
        _check(1 <= self.keep <= 100, f"{path}.keep", f"must be in [1, 100], got {self.keep}")


@dataclass
class IngestConfig:
    #: Records per read (one decode + bin pass per batch).
    batch_size: int = 65536
    poll_timeout: Duration = Duration(0.2)
    #: Stop (after a final evaluation and checkpoint) when every source is exhausted.
    exit_when_done: bool = False

    def validate(self, path: str) -> None:
        _check(1 <= self.batch_size <= 10_000_000, f"{path}.batch_size",
               f"must be in [1, 1e7], got {self.batch_size}")
        _check(0.001 <= self.poll_timeout <= 60, f"{path}.poll_timeout",
               f"must be in [1ms, 60s] (0 would burn a core while idle), got {self.poll_timeout}")


@dataclass
class AlertmanagerConfig:
    """Push alert states to Alertmanager's v2 API after each round (off while ``url`` is empty)."""

    url: str = ""
    timeout: Duration = Duration(5.0)
    #: ``endsAt`` of a firing alert is now + this: Alertmanager resolves it by itself if the agent dies.
    firing_ttl: Duration = Duration(300.0)
    #: Link shown by Alertmanager (e.g. the agent's status page).
    generator_url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    external_labels: dict[str, str] = field(default_factory=dict)

    def validate(self, path: str) -> None:
        if self.url:
            _check(bool(re.fullmatch(r"https?://[^/\s]+(/\S*)?", self.url)), f"{path}.url",
                   f"expected http(s)://host:port[/prefix], got {self.url!r}")
        _check(self.timeout > 0, f"{path}.timeout", "must be positive")
        _check(self.firing_ttl > 0, f"{path}.firing_ttl", "must be positive")


@dataclass
class AlertsConfig:
    """Alert rules for :mod:`calmon.alerts` (format defined there), evaluated after each round."""

    enabled: bool = True
    rules: list[dict[str, Any]] = field(default_factory=list)
    alertmanager: AlertmanagerConfig = field(default_factory=AlertmanagerConfig)


@dataclass
class PublisherConfig:
    """Where refreshed calibrators are published: a directory store or a Kafka compacted topic."""

    type: Literal["directory", "kafka"] = "directory"
    #: ``directory``: ``path`` (default ``<state_dir>/calibrators``); ``kafka``: ``bootstrap_servers``, ``topic``...
    options: dict[str, Any] = field(default_factory=dict)

    def validate(self, path: str) -> None:
        if self.type == "directory":
            unknown = sorted(set(self.options) - {"path"})
            _check(not unknown, f"{path}.options.{unknown[0] if unknown else ''}",
                   "unknown option of a directory publisher (known: path)")
        else:
            _check(bool(self.options.get("topic")), f"{path}.options.topic", "is required for a kafka publisher")


@dataclass(frozen=True)
class RecalibrationOptions(RefreshLimits):
    """``recalibration.options``: the refit's minimum sizes, in rows of the window's reservoir.

    ``min_train`` (default 200) and ``min_holdout`` (default 50) are those of
    :class:`calmon.calibration.limits.RefreshLimits`, their one place, and this object is passed
    to :func:`~calmon.calibration.refresh.refresh` as it is.  Every fifth reservoir row is held
    out, so the default reservoir of 256 rows gives 205 training and 51 held-out rows: enough for
    both minimums.  A model whose reservoir holds fewer rows is not refitted.
    """

    #: Deprecated: use ``recalibration.publishers`` (a directory store at this path).
    store_dir: str | None = None

    def validate(self, path: str) -> None:
        for key, v in (("min_train", self.min_train), ("min_holdout", self.min_holdout)):
            _check(v >= 1, f"{path}.{key}", f"must be an integer >= 1, got {v!r}")


@dataclass
class RecalibrationConfig:
    """Scheduled recalibration refresh (:mod:`calmon.calibration.refresh`)."""

    enabled: bool = False
    every: Duration = Duration(3600.0)
    #: Window whose statistics the calibrators are fitted on.
    window: str = "24h"
    methods: list[str] = field(default_factory=lambda: ["temperature"])
    #: ``min_train`` (200), ``min_holdout`` (50): rows of the reservoir (:class:`RecalibrationOptions`);
    #: ``store_dir`` (deprecated: use ``publishers``).
    options: RecalibrationOptions = field(default_factory=RecalibrationOptions)
    #: Where new revisions go; empty = one directory store at ``<state_dir>/calibrators``.
    publishers: list[PublisherConfig] = field(default_factory=list)

    def validate(self, path: str) -> None:
        _check(self.every > 0, f"{path}.every", "must be positive")


@dataclass
class EstimationConfig:
    """Label-free estimates (CBPE) and score drift from the prediction-side statistics of each window."""

    enabled: bool = True
    #: Decision threshold of the estimated confusion matrix (binary models).
    threshold: float = 0.5
    #: Level of the estimates' prediction intervals.
    level: float = 0.95
    #: Intervals of the score-drift comparison (cut at the reference's quantiles).
    drift_bins: int = 10

    def validate(self, path: str) -> None:
        _check(0 < self.threshold < 1, f"{path}.threshold", f"must lie in (0, 1), got {self.threshold}")
        _check(0.5 <= self.level < 1, f"{path}.level", f"must lie in [0.5, 1), got {self.level}")
        _check(2 <= self.drift_bins <= 100, f"{path}.drift_bins", f"must be in [2, 100], got {self.drift_bins}")


@dataclass
class ToleranceConfig:
    """How large a significant miscalibration must be to matter (:mod:`calmon.evaluate.verdict`)."""

    #: A rejection whose ECE interval's upper bound is below this is "calibrated within tolerance; no action"
    #: (0: every significant rejection is material, the tests' verdict alone).
    ece: float = 0.01

    def validate(self, path: str) -> None:
        _check(not isinstance(self.ece, bool) and 0 <= self.ece < 1, f"{path}.ece",
               f"must lie in [0, 1) (an ECE: 0.01 is 1 %), got {self.ece!r}")


@dataclass
class VerdictConfig:
    """The verdict in words: what is worth acting on."""

    tolerance: ToleranceConfig = field(default_factory=ToleranceConfig)


@dataclass
class ChangesConfig:
    """Sequential change detection on each model's calibration (:mod:`calmon.algorithms.changepoint`)."""

    enabled: bool = True
    #: Events per block; a detection comes at least one block after the change.
    block: int = 256
    #: Page-Hinkley drift allowance and threshold (units of the N(0, 1) block statistic).
    delta: float = 0.25
    threshold: float = 20.0
    signals: list[str] = field(default_factory=lambda: ["residual", "confidence", "high"])

    def validate(self, path: str) -> None:
        _check(16 <= self.block <= 1_000_000, f"{path}.block", f"must be in [16, 1e6], got {self.block}")
        _check(self.delta > 0, f"{path}.delta", "must be positive")
        _check(self.threshold > 0, f"{path}.threshold", "must be positive")
        known = ("residual", "confidence", "high")
        for i, sig in enumerate(self.signals):
            _check(sig in known, f"{path}.signals.{i}", f"must be one of {', '.join(known)}, got {sig!r}")
        _check(len(set(self.signals)) == len(self.signals), f"{path}.signals", "has duplicates")


@dataclass
class ClusterConfig:
    """The partitioned agent: ``calmon run --role ingest|evaluate`` (see ``docs/cluster.md``)."""

    #: Keys of earlier releases that are refused with their reason (the loader's one-line error names them).
    REMOVED: ClassVar[dict[str, str]] = {
        "intents_topic": "removed: the ingest stage now uses Kafka transactions (one per range, fenced per input "
                         "partition; docs/cluster.md), so there are no intents; delete this key, and the topic once "
                         "every worker runs this release (old and new workers must not run together)"}

    #: Kafka bootstrap servers of the internal topics (required by ``--role ingest`` and ``--role evaluate``).
    bootstrap_servers: str = ""
    #: Statistic deltas, keyed by model (the evaluators' input).
    deltas_topic: str = "calmon-deltas"
    #: The ingest stage's per-partition state (offset, join buffers), keyed by input partition; compact it.
    state_topic: str = "calmon-ingest-state"
    #: Evaluator snapshots (one record per model, in the partition of its deltas), read on assignment; compact it.
    snapshots_topic: str = "calmon-evaluator-snapshots"
    #: Seconds between two evaluator snapshots of the changed models (0 = off: restores replay the deltas).
    snapshot_every: Duration = Duration(60.0)
    ingest_group: str = "calmon-ingest"
    evaluate_group: str = "calmon-evaluate"
    #: Partitions of the deltas topic when calmon creates it (the most evaluators that can share the models).
    partitions: int = 12
    #: Longest wait (seconds) before a partition's buffered records are processed as one range.
    linger: Duration = Duration(0.5)
    #: kafka-python client options for the internal topics (security_protocol, sasl_*, ssl_*, ...).
    client: dict[str, Any] = field(default_factory=dict)

    def validate(self, path: str) -> None:
        topics = {"deltas_topic": self.deltas_topic, "state_topic": self.state_topic,
                  "snapshots_topic": self.snapshots_topic}
        for key, name in topics.items():
            _check(bool(re.fullmatch(r"[A-Za-z0-9._-]{1,249}", name)), f"{path}.{key}",
                   f"must be a Kafka topic name ([A-Za-z0-9._-], 1-249 characters), got {name!r}")
        _check(len(set(topics.values())) == 3, path, "deltas_topic, state_topic and snapshots_topic must differ, "
               f"got {sorted(topics.values())}")
        for key in ("ingest_group", "evaluate_group"):
            _check(bool(str(getattr(self, key)).strip()), f"{path}.{key}", "must not be empty")
        _check(self.ingest_group != self.evaluate_group, f"{path}.evaluate_group", "must differ from ingest_group")
        _check(1 <= self.partitions <= 10000, f"{path}.partitions", f"must be in [1, 10000], got {self.partitions}")
        _check(0.001 <= self.linger <= 60, f"{path}.linger", f"must be in [1ms, 60s], got {self.linger}")
        _check(self.snapshot_every == 0 or 1 <= self.snapshot_every <= 86400, f"{path}.snapshot_every",
               f"must be 0 (off) or in [1s, 1d], got {self.snapshot_every}")


@dataclass
class Config:
    """The whole agent configuration (see ``config/calmon.example.yaml``)."""

    state_dir: str = "./calmon-state"
    sources: list[SourceConfig] = field(default_factory=list)
    dead_letter: DeadLetterConfig = field(default_factory=DeadLetterConfig)
    #: Per-model settings; the key ``default`` applies to models discovered in the stream.
    models: dict[str, ModelConfig] = field(default_factory=dict)
    #: Accept models that are not listed under ``models`` (up to ``limits.max_models``).
    accept_unknown_models: bool = True
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    join: JoinConfig = field(default_factory=JoinConfig)
    windows: WindowsConfig = field(default_factory=WindowsConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    exporter: ExporterConfig = field(default_factory=ExporterConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    recalibration: RecalibrationConfig = field(default_factory=RecalibrationConfig)
    changes: ChangesConfig = field(default_factory=ChangesConfig)
    estimation: EstimationConfig = field(default_factory=EstimationConfig)
    verdict: VerdictConfig = field(default_factory=VerdictConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def validate(self, path: str) -> None:
        _check(len(self.sources) >= 1, "sources", "needs at least one source")
        names = [s.name for s in self.sources]
        _check(len(set(names)) == len(names), "sources", f"source names must be unique, got {names}")
        for name, m in self.models.items():
            _check(bool(re.fullmatch(r"[A-Za-z0-9_.:/-]+", name)), f"models.{name}",
                   "model names are [A-Za-z0-9_.:/-]+")
            _check(m.classes is None or m.classes <= self.limits.max_classes, f"models.{name}.classes",
                   f"must be <= limits.max_classes ({self.limits.max_classes}), got {m.classes}")
        if self.recalibration.enabled:
            _check(self.recalibration.window in self.windows.names, "recalibration.window",
                   f"must be one of windows.names {self.windows.names}, got {self.recalibration.window!r}")
        _check(self.windows.allowed_lateness >= self.join.ttl, "windows.allowed_lateness",
               f"must be >= join.ttl ({format_duration(self.join.ttl)}): joined events can be that late")

    def model(self, name: str) -> ModelConfig:
        """Settings of model ``name`` (its own entry, else ``default``)."""
        return self.models.get(name) or self.models.get("default") or ModelConfig()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


