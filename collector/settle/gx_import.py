"""Great Expectations, imported quietly, and its refusal of an expectation in one line.

Shared by the run's GX objects (:mod:`collector.settle.gx_runtime`) and ``collector validate``'s
check of a suite's kwargs (:func:`collector.settle.suite.kwargs_problems`), so both say the same
thing. It needs nothing of :mod:`collector.settle.suite` (an expectation is anything that says
where it is), so the suite module, read without GX, and the GX side that builds on it do not
import each other.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol

from collector._text import one_line
from collector.errors import ConfigError

__all__ = ["Located", "build_expectation", "import_gx", "refusal"]


class Located(Protocol):
    """An expectation of a suite file (:class:`collector.settle.suite.Spec`), for messages."""

    @property
    def where(self) -> str:
        """Where it is in its file (``expectations[2] (expect_column_values_to_match_regex)``)."""
        ...


def import_gx() -> Any:
    """Import GX quietly: no analytics, no progress bars, no log output unless asked for."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    gx_logger = logging.getLogger("great_expectations")
    if not any(isinstance(h, logging.NullHandler) for h in gx_logger.handlers):
        gx_logger.addHandler(logging.NullHandler())
    import great_expectations

    return great_expectations


def build_expectation(configuration: Any, spec: Located, path: object) -> Any:
    """GX's expectation object for ``spec``, or one ConfigError naming the suite file and the
    expectation: an unknown type, or kwargs GX's own models refuse (a missing ``column``).

    The run builds its suite with it, and ``collector validate`` checks a suite with
    :func:`refusal` (collector.settle.suite.kwargs_problems), so both say the same thing.
    """
    try:
        return configuration.to_domain_obj()
    except Exception as exc:
        raise ConfigError(f"{path}: {spec.where}: {refusal(exc)}") from exc


def refusal(exc: Exception) -> str:
    """What GX's refusal to build an expectation means, in one line without the file's name
    (``unknown expectation type``, ``invalid kwargs: column: field required``)."""
    if type(exc).__name__ == "ExpectationNotFoundError":
        return "unknown expectation type"
    if type(exc).__name__ == "ValidationError":
        problem = _pydantic_message(exc)
    else:
        problem = one_line(getattr(exc, "message", None) or exc)
    return f"invalid kwargs: {problem}"


def _pydantic_message(exc: Exception) -> str:
    """``field: problem; field: problem`` from a pydantic (v1) ValidationError, one per field."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return one_line(exc)
    seen: dict[str, str] = {}
    try:
        for error in errors():
            loc = ".".join(str(part) for part in error.get("loc", ()) if part != "__root__")
            seen.setdefault(loc, str(error.get("msg", "")))
    except Exception:
        return one_line(exc)
    return one_line("; ".join(f"{loc}: {msg}" if loc else msg for loc, msg in seen.items()))
