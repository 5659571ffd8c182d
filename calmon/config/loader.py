"""Loading the configuration: YAML (safe), ``${VAR}`` substitution, ``CALMON__`` overrides, typed build.

Hostile YAML
------------
The YAML is read with :class:`BoundedLoader`, a :class:`yaml.SafeLoader` (``yaml.safe_load``
semantics: no ``!!python/...`` tags) that refuses documents nested deeper than
:data:`MAX_DEPTH` and documents whose aliases expand to more than :data:`MAX_NODES` nodes or
deeper than :data:`MAX_DEPTH` (the "billion laughs" attack), or that refer to themselves.
Anchors and aliases within those bounds (``<<: *defaults``) keep working.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from calmon.config.schema import (
    Config,
    ConfigError,
    Duration,
    TesterConfig,
    TierConfig,
    WindowsConfig,
    _check,
    parse_duration,
)

ENV_PREFIX = "CALMON__"
#: Deepest nesting of a configuration document, also after expanding aliases.
MAX_DEPTH = 64
#: Most nodes a configuration document may expand to (after aliases).
MAX_NODES = 100_000
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


# --------------------------------------------------------------------------------------------- reading
class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with bounded nesting and alias expansion (see the module docstring).

    Examples
    --------
    >>> yaml.load("a: &x [1, 2]\\nb: *x", Loader=BoundedLoader)
    {'a': [1, 2], 'b': [1, 2]}
    >>> try:
    ...     yaml.load("[" * 1000 + "]" * 1000, Loader=BoundedLoader)
    ... except yaml.YAMLError as exc:
    ...     print(exc.problem)
    nested deeper than 64 levels
    """

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  self.peek_event().start_mark)
            node: yaml.Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1

    def get_single_node(self) -> yaml.Node | None:
        node: yaml.Node | None = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for kv in node.value for n in kv]
    return []


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a node graph that expands (aliases copied out) beyond the bounds, or contains a cycle.

    Iterative post-order over the graph with each node once: linear in the text, whatever the
    expansion.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            kids = [id(k) for k in _children(node)]
            size[key] = 1 + sum(size[k] for k in kids)
            depth[key] = 1 + max((depth[k] for k in kids), default=0)
            open_.discard(key)
            why = (f"expands to more than {MAX_NODES} nodes (nested aliases?)" if size[key] > MAX_NODES else
                   f"nested deeper than {MAX_DEPTH} levels once aliases are expanded" if depth[key] > MAX_DEPTH
                   else "")
            if why:
                raise yaml.composer.ComposerError(None, None, why, node.start_mark)
            continue
        if key in size:
            continue
        if key in open_:
            raise yaml.composer.ComposerError(None, None, "an alias refers to itself", node.start_mark)
        open_.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in size)


def _yaml_problem(exc: yaml.YAMLError, where: bool = False) -> str:
    """One line of a YAML error (``str(exc)`` spans lines: context, marks and a caret).

    Examples
    --------
    >>> try:
    ...     load_yaml("a: [1, 2")
    ... except yaml.YAMLError as exc:
    ...     print(_yaml_problem(exc, where=True))
     (line 1, column 9): expected ',' or ']', but got '<stream end>'
    """
    mark = getattr(exc, "problem_mark", None)
    at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    return f"{at}: {problem}" if where else f"{problem}{at}"


def load_yaml(text: str) -> Any:
    """Parse YAML text with :class:`BoundedLoader` (``yaml.safe_load`` semantics, bounded)."""
    return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - BoundedLoader is a SafeLoader


# --------------------------------------------------------------------------------------------- building
def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _build(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _build(inner[0], value, path)
    if origin is Literal:
        _check(value in args, path, f"must be one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if tp is Duration:
        return Duration(parse_duration(value, path))
    if tp is bool:
        _check(isinstance(value, bool), path, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        _check(isinstance(value, int) and not isinstance(value, bool), path,
               f"must be an integer, got {value!r}")
        return value
    if tp is float:
        _check(isinstance(value, int | float) and not isinstance(value, bool), path,
               f"must be a number, got {value!r}")
        return float(value)
    if tp is str:
        _check(isinstance(value, str | int | float) and not isinstance(value, bool), path,
               f"must be a string, got {value!r}")
        return str(value)
    if tp is Any:
        return value
    if origin is list:
        _check(isinstance(value, list), path, f"must be a list, got {type(value).__name__}")
        return [_build(args[0], v, f"{path}.{i}") for i, v in enumerate(value)]
    if origin is dict:
        _check(isinstance(value, dict), path, f"must be a mapping, got {type(value).__name__}")
        return {str(k): _build(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if tp is TesterConfig and isinstance(value, str):
            value = {"name": value}
        if tp is TierConfig and isinstance(value, list) and len(value) == 2:
            value = {"width": value[0], "count": value[1]}
        if value is None:
            value = {}
        _check(isinstance(value, dict), path, f"must be a mapping, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        known = {f.name for f in dataclasses.fields(tp)}
        removed: dict[str, str] = getattr(tp, "REMOVED", {})
        for key in value:
            if key not in known:
                where = f"{path}.{key}" if path else str(key)
                if key in removed:  # a key of an earlier release: say why it went, not just "unknown"
                    raise ConfigError(where, removed[key])
                raise ConfigError(where, f"unknown key (known keys: {', '.join(sorted(known))})")
        kwargs = {k: _build(hints[k], v, f"{path}.{k}" if path else k) for k, v in value.items()}
        obj = typing.cast(Any, tp)(**kwargs)
        if hasattr(obj, "validate"):
            obj.validate(path)
        return obj
    raise ConfigError(path, f"unsupported schema type {_type_name(tp)}")  # pragma: no cover


def _substitute(value: Any, env: typing.Mapping[str, str], path: str) -> Any:
    if isinstance(value, str):
        def repl(m: re.Match[str]) -> str:
            if m.group(1) in env:
                return env[m.group(1)]
            if m.group(2) is not None:
                return m.group(2)
            raise ConfigError(path, f"environment variable {m.group(1)} is not set")
        return _ENV_REF.sub(repl, value)
    if isinstance(value, list):
        return [_substitute(v, env, f"{path}.{i}") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _substitute(v, env, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    return value


def apply_env_overrides(doc: dict[str, Any], env: typing.Mapping[str, str]) -> dict[str, Any]:
    """Apply ``CALMON__A__B=value`` overrides (keys lower-cased, values parsed as YAML scalars).

    Examples
    --------
    >>> apply_env_overrides({"exporter": {"port": 1}}, {"CALMON__EXPORTER__PORT": "9100"})
    {'exporter': {'port': 9100}}
    """
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX):
            continue
        keys = [k.lower() for k in var[len(ENV_PREFIX):].split("__")]
        path = ".".join(keys)
        if not all(keys):
            raise ConfigError(path, f"bad environment override name {var}")
        if len(keys) > MAX_DEPTH:
            raise ConfigError(path[:200], f"{var[:60]}...: an override is nested deeper than {MAX_DEPTH} levels")
        try:
            value = load_yaml(env[var]) if env[var] != "" else ""
        except yaml.YAMLError as exc:
            raise ConfigError(path, f"cannot parse value of {var}: {_yaml_problem(exc)}") from None
        node: Any = doc
        for i, key in enumerate(keys[:-1]):
            nxt_is_index = keys[i + 1].isdigit()
            if isinstance(node, list):
                _check(key.isdigit() and int(key) < len(node), ".".join(keys[: i + 1]),
                       f"no list item {key} (from {var})")
                node = node[int(key)]
            else:
                _check(isinstance(node, dict), ".".join(keys[:i]),
                       f"is a {type(node).__name__}, not a mapping: cannot set {path} (from {var})")
                if key not in node or node[key] is None:
                    node[key] = [] if nxt_is_index else {}
                node = node[key]
        last = keys[-1]
        if isinstance(node, list):
            _check(last.isdigit() and int(last) <= len(node), path, f"no list item {last} (from {var})")
            if int(last) == len(node):
                node.append(value)
            else:
                node[int(last)] = value
        else:
            _check(isinstance(node, dict), ".".join(keys[:-1]),
                   f"is a {type(node).__name__}, not a mapping: cannot set {path} (from {var})")
            node[last] = value
    return doc


def build_config(doc: dict[str, Any] | None, env: typing.Mapping[str, str] | None = None,
                 base_dir: str | Path | None = None) -> Config:
    """Validate a configuration document (already parsed YAML) and return a :class:`Config`.

    Parameters
    ----------
    doc
        Parsed YAML mapping (``None`` = empty).
    env
        Environment for ``${VAR}`` substitution and ``CALMON__...`` overrides (default ``os.environ``).
    base_dir
        Directory against which relative ``state_dir`` and source paths are resolved (default: cwd).

    Returns
    -------
    Config

    Raises
    ------
    ConfigError
        Naming the key path and the reason.

    Examples
    --------
    >>> cfg = build_config({"sources": [{"path": "events.jsonl"}], "exporter": {"port": 9100}}, env={})
    >>> cfg.exporter.port, cfg.sources[0].type, cfg.windows.names[-1]
    (9100, 'file', 'all')
    >>> try:
    ...     build_config({"sources": [{"path": "x"}], "exporter": {"prot": 1}}, env={})
    ... except ConfigError as err:
    ...     print(err.path)
    exporter.prot
    """
    env = os.environ if env is None else env
    doc = {} if doc is None else doc
    _check(isinstance(doc, dict), "", f"the configuration must be a mapping, got {type(doc).__name__}")
    doc = _substitute(doc, env, "")
    doc = apply_env_overrides(doc, env)
    doc = _lateness_follows_ttl(doc)
    cfg = _build(Config, doc, "")
    if base_dir is not None:
        base = Path(base_dir)
        cfg.state_dir = str(base / cfg.state_dir) if not Path(cfg.state_dir).is_absolute() else cfg.state_dir
        for s in cfg.sources:
            if s.path and not Path(s.path).is_absolute():
                s.path = str(base / s.path)
    return cfg


def _lateness_follows_ttl(doc: dict[str, Any]) -> dict[str, Any]:
    """Without ``windows.allowed_lateness``, a ``join.ttl`` beyond its default raises it to the TTL.

    A joined event takes its prediction's time and can arrive ``join.ttl`` after it, so lateness must be at least the
    TTL; a user who sets only ``join.ttl: 21h`` means that (an explicit lateness below the TTL is still an error).
    """
    join, windows = doc.get("join"), doc.get("windows")
    if not isinstance(join, dict) or "ttl" not in join:
        return doc
    if windows is not None and (not isinstance(windows, dict) or "allowed_lateness" in windows):
        return doc
    try:
        ttl = parse_duration(join["ttl"], "join.ttl")
    except ConfigError:
        return doc  # the build names the key
    default = WindowsConfig().allowed_lateness
    if ttl <= default:
        return doc
    return {**doc, "windows": {**(windows or {}), "allowed_lateness": ttl}}


def load_config(path: str | Path, env: typing.Mapping[str, str] | None = None) -> Config:
    """Read, override and validate the YAML file ``path`` (relative paths resolve against its directory).

    Parameters
    ----------
    path
        YAML file.
    env
        Environment (default ``os.environ``).

    Returns
    -------
    Config

    Raises
    ------
    ConfigError
        For a missing/unreadable file, bad YAML, an unknown key or a bad value.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read configuration: {exc.strerror or exc}") from None
    try:
        doc = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), f"invalid YAML{_yaml_problem(exc, where=True)}") from None
    return build_config(doc, env=env, base_dir=p.resolve().parent)
