"""The public surface of ``collector`` and its one exception tree (as httpx's
tests/test_exported_members.py checks its own)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType

import pytest

import collector
from collector import errors
from collector.errors import CollectorError

# Exceptions that never leave the module raising them (collector/errors.py says why each).
OUTSIDE_THE_TREE = {
    "collector.fetch.engine._TooLate",  # control flow inside one call
    "collector.fetch.engine._Deferred",  # the same: an open circuit breaker, caught in the engine
    "collector.fetch.transport.RefusedAddress",  # aiohttp's resolver must raise an OSError
    "collector.fetch.decoding.BodyTooLarge",  # caught by the engine, which raises FetchError
    "collector.demo.site._BadParameter",  # the demo site's own request parsing
}


def public_names(module: ModuleType) -> dict[str, object]:
    """A module's public names and values, its lazy re-exports resolved (collector/_lazy.py)."""
    return {name: getattr(module, name) for name in dir(module) if not name.startswith("_")}


LAZY_PACKAGES = [
    "collector",
    "collector.config",
    "collector.deadletter",
    "collector.frontier",
    "collector.sinks",
]


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_lazy_packages_resolve_every_name_from_its_home(name: str) -> None:
    """Each lazily re-exported name is the object its home module holds, and ``__all__`` names
    nothing the package cannot give (the names under ``TYPE_CHECKING`` are mypy's to check)."""
    package = importlib.import_module(name)
    homes: dict[str, str] = vars(package)["_HOMES"]
    assert set(package.__all__) <= set(homes)
    for public, home in homes.items():
        assert getattr(package, public) is getattr(importlib.import_module(home), public)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = package.Nope


def collector_modules() -> list[ModuleType]:
    return [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(collector.__path__, "collector.")
    ]


def test_all_exports_exactly_the_public_names() -> None:
    """Every public name imported into collector/__init__.py is in __all__, and the reverse."""
    public = {
        name
        for name, value in public_names(collector).items()
        if not inspect.ismodule(value) and name != "annotations"
    }
    assert public == set(collector.__all__)
    assert collector.__all__ == sorted(collector.__all__)
    for name in collector.__all__:
        assert getattr(collector, name).__module__.startswith("collector.")


def test_every_exported_exception_is_in_the_tree() -> None:
    exported = [getattr(collector, name) for name in collector.__all__]
    exported = [value for value in exported if inspect.isclass(value)]
    exceptions = [v for v in exported if issubclass(v, BaseException)]
    assert {e.__name__ for e in exceptions} >= {"CollectorError", "SourceError", "SourceBusy"}
    for exc in exceptions:
        assert issubclass(exc, CollectorError), exc


def exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in collector_modules():
        for name in dir(module):
            value = getattr(module, name)
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                found[f"{module.__name__}.{name}"] = value
    return found


def drawn_parents() -> dict[str, str]:
    """Class name -> parent name, as the tree in collector/errors.py draws them."""
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = [(-1, "CollectorError")]
    for line in (errors.__doc__ or "").splitlines():
        match = re.search(r"[├└]── (\w+)", line)
        if match is None:
            continue
        depth = match.start()
        while stack[-1][0] >= depth:
            stack.pop()
        parents[match.group(1)] = stack[-1][1]
        stack.append((depth, match.group(1)))
    return parents


def check_tree(found: dict[str, type[BaseException]]) -> None:
    assert set(found) >= OUTSIDE_THE_TREE, "an exemption names a class that is gone"
    in_tree = {w: exc for w, exc in found.items() if w not in OUTSIDE_THE_TREE}
    parents = drawn_parents()
    for where, exc in in_tree.items():
        assert issubclass(exc, CollectorError), f"{where} does not derive from CollectorError"
        if exc is not CollectorError:
            assert parents.get(exc.__name__) == exc.__mro__[1].__name__, (
                f"{where} is not drawn under {exc.__mro__[1].__name__} in collector/errors.py"
            )
    assert set(parents) == {exc.__name__ for exc in in_tree.values()} - {"CollectorError"}


def test_every_exception_derives_from_collector_error_as_drawn() -> None:
    """A new exception class must join the tree, and its drawing in collector/errors.py."""
    check_tree(exception_classes())


class Stray(Exception):
    pass


class Undrawn(CollectorError):
    pass


class Misplaced(errors.BackendError):  # drawn nowhere, and its name is not SourceError's
    pass


@pytest.mark.parametrize("extra", [Stray, Undrawn, Misplaced])
def test_the_tree_check_fails_on_a_class_outside_it(extra: type[BaseException]) -> None:
    found = exception_classes()
    with pytest.raises(AssertionError):
        check_tree({**found, f"collector.x.{extra.__name__}": extra})
    del found["collector.config.SourceError"]  # a drawn class that no longer exists
    with pytest.raises(AssertionError):
        check_tree(found)
