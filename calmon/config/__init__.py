"""Agent configuration: a YAML document validated against a typed schema, with environment overrides.

Every section is a dataclass; :func:`load_config` reads YAML, substitutes ``${VAR}`` /
``${VAR:-default}`` in strings, applies ``CALMON__SECTION__KEY=value`` environment overrides
(``__`` separates the key path; list items by index, e.g. ``CALMON__SOURCES__0__PATH``;
values are parsed as YAML scalars), and builds the dataclasses.  Any unknown key or bad value
raises :class:`ConfigError` whose message starts with the key path, e.g.
``exporter.port: must be an integer in [0, 65535], got 'http'`` -- ``calmon run`` prints that
line and exits with status 2.

Durations are numbers of seconds or strings like ``"250ms"``, ``"30s"``, ``"5m"``, ``"1h"``,
``"7d"``.  See ``config/calmon.example.yaml`` for every field with its meaning.
"""

from calmon.config.loader import ENV_PREFIX, apply_env_overrides, build_config, load_config
from calmon.config.schema import (
    AlertmanagerConfig,
    AlertsConfig,
    BasicAuthConfig,
    ChangesConfig,
    CheckpointConfig,
    Config,
    ConfigError,
    DeadLetterConfig,
    Duration,
    EstimationConfig,
    EvaluationConfig,
    ExporterConfig,
    IngestConfig,
    JoinConfig,
    LimitsConfig,
    ModelConfig,
    PublisherConfig,
    RecalibrationConfig,
    SourceConfig,
    TesterConfig,
    TierConfig,
    TLSConfig,
    WindowsConfig,
    format_duration,
    parse_duration,
)

__all__ = [
    "ENV_PREFIX", "AlertmanagerConfig", "AlertsConfig", "BasicAuthConfig", "ChangesConfig", "CheckpointConfig",
    "Config", "ConfigError", "DeadLetterConfig", "Duration", "EstimationConfig", "EvaluationConfig",
    "ExporterConfig", "IngestConfig", "JoinConfig", "LimitsConfig", "ModelConfig", "PublisherConfig",
    "RecalibrationConfig", "SourceConfig", "TLSConfig", "TesterConfig", "TierConfig", "WindowsConfig",
    "apply_env_overrides", "build_config", "format_duration", "load_config", "parse_duration"
]
