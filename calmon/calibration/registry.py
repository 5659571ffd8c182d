"""The calibration methods calmon knows: one explicit table, and the method specs of a configuration.

:data:`BUILTIN` lists the built-in calibrator classes; importing this module registers each of
them once in :data:`CALIBRATORS` (a :class:`calmon.plugins.registry.Registry`, which refuses a second
class under a taken name).  Plugins call :func:`register_calibrator`.

Examples
--------
>>> sorted(CALIBRATORS)
['angular', 'histogram', 'isotonic', 'lp', 'platt', 'polynomial', 'scaling-binning', 'temperature']
>>> make_calibrator("platt", link="probit").link
'probit'
>>> check_methods(["platt", {"method": "histogram", "bins": 7}])
>>> try:
...     check_methods(["plat"])
... except ValueError as exc:
...     print(exc)  # doctest: +NORMALIZE_WHITESPACE
unknown calibration method 'plat' (known: angular, histogram, isotonic, lp, platt, polynomial,
    scaling-binning, temperature)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

from calmon.calibration.angular import AngularCalibrator
from calmon.calibration.base import KINDS, Calibrator, CalibratorError
from calmon.calibration.histogram import HistogramCalibrator
from calmon.calibration.isotonic import IsotonicCalibrator
from calmon.calibration.lp import LPCalibrator
from calmon.calibration.platt import PlattCalibrator
from calmon.calibration.polynomial import PolynomialCalibrator
from calmon.calibration.scaling_binning import ScalingBinningCalibrator
from calmon.calibration.temperature import TemperatureCalibrator
from calmon.plugins.registry import Registry

__all__ = ["BUILTIN", "CALIBRATORS", "MethodSpec", "check_methods", "get_calibrator", "make_calibrator",
           "register_calibrator"]

C = TypeVar("C", bound="type[Calibrator]")

#: The built-in calibrator classes, registered under their ``method`` when this module is imported.
BUILTIN: tuple[type[Calibrator], ...] = (PlattCalibrator, AngularCalibrator, TemperatureCalibrator,
                                         HistogramCalibrator, IsotonicCalibrator, LPCalibrator, PolynomialCalibrator,
                                         ScalingBinningCalibrator)

#: Calibrator classes by method name.
CALIBRATORS: Registry[type[Calibrator]] = Registry("calibration method")


def register_calibrator(cls: C) -> C:
    """Register a :class:`Calibrator` subclass under ``cls.method`` (``ValueError`` if the name is taken).

    Raises
    ------
    TypeError
        ``cls`` is not a Calibrator subclass, has no ``method`` or an unknown ``kind``.
    """
    if not (isinstance(cls, type) and issubclass(cls, Calibrator)):
        raise TypeError("register_calibrator expects a Calibrator subclass")
    if not cls.method:
        raise TypeError(f"{cls.__name__} must set the class attribute 'method'")
    if cls.kind not in KINDS:
        raise TypeError(f"{cls.__name__}.kind must be one of {KINDS}, got {cls.kind!r}")
    CALIBRATORS.register(cls.method, cls)
    return cls


for _cls in BUILTIN:
    register_calibrator(_cls)


def get_calibrator(method: Any) -> type[Calibrator]:
    """The registered class for ``method``; :class:`CalibratorError` naming the known methods otherwise."""
    if isinstance(method, str) and method in CALIBRATORS:
        return CALIBRATORS.get(method)
    known = ", ".join(CALIBRATORS.names()) or "none"
    raise CalibratorError(f"unknown calibration method {method!r} (known: {known})")


def make_calibrator(method: str, **options: Any) -> Calibrator:
    """Instantiate ``method`` with constructor ``options`` (e.g. ``make_calibrator("platt", link="probit")``)."""
    return get_calibrator(method)(**options)


@dataclass
class MethodSpec:
    """A configured method: registry name plus constructor options (e.g. ``{"link": "probit"}``).

    Examples
    --------
    >>> MethodSpec.parse({"method": "platt", "link": "probit"}).label
    'platt(link=probit)'
    """

    method: str
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: MethodLike) -> MethodSpec:
        """From ``"platt"``, ``{"method": "platt", "link": "probit"}`` or a MethodSpec."""
        if isinstance(spec, MethodSpec):
            return spec
        if isinstance(spec, str):
            return cls(spec)
        if isinstance(spec, Mapping) and isinstance(spec.get("method"), str):
            opts = {k: v for k, v in spec.items() if k != "method"}
            opts = opts.get("options", opts) if set(opts) == {"options"} else opts
            return cls(spec["method"], dict(opts))
        raise ValueError(f"method spec must be a name or {{'method': name, ...options}}, got {spec!r}")

    @property
    def label(self) -> str:
        """``method`` or ``method(key=value,...)``: a readable name for results and logs."""
        if not self.options:
            return self.method
        return self.method + "(" + ",".join(f"{k}={v}" for k, v in sorted(self.options.items())) + ")"


MethodLike = Union[str, Mapping[str, Any], MethodSpec]  # noqa: UP007 - a runtime alias must work on Python 3.10


def check_methods(methods: Iterable[MethodLike]) -> None:
    """Validate configured methods at start-up: each must be registered and accept its options.

    Raises
    ------
    ValueError
        (a :class:`CalibratorError` for an unknown method) naming the offending method.
    """
    specs = [MethodSpec.parse(m) for m in methods]
    if not specs:
        raise ValueError("at least one calibration method is needed")
    for spec in specs:
        cls = get_calibrator(spec.method)
        try:
            cls(**spec.options)
        except TypeError as exc:
            raise ValueError(f"bad options for calibration method {spec.label!r}: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"calibration method {spec.label!r}: {exc}") from None
