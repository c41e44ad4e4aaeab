"""The error a source file raises: one actionable line per problem.

Apart from the loader so that code which only reports a bad file (every CLI command) need not
import the pydantic models that find the problems.
"""

from __future__ import annotations

from collector.errors import ConfigError

__all__ = ["MORE_NOT_SHOWN", "SourceError"]

MORE_NOT_SHOWN = "more problems not shown"
"""How the last line of a list cut at ``MAX_PROBLEMS`` begins (after the file's name)."""


class SourceError(ConfigError):
    """A source file is invalid; ``problems`` holds one actionable line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


SourceError.__module__ = "collector.config"  # its public home (the error tree draws it there)
