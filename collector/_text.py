"""How values are shown inside one-line messages: as the user wrote them.

``repr`` doubles every backslash (a regex ``\\d+`` shows as ``'\\\\d+'``) and whitespace
squashing hides the very spaces a message is about (``'  tools '``). These helpers quote a value
verbatim when it is printable on one line and fall back to ``repr`` only when it is not.
"""

from __future__ import annotations

import re

__all__ = ["counted", "one_line", "quoted"]

_LINE_BREAKS = re.compile(r"[ \t]*[\r\n]+[ \t]*")


def quoted(value: object) -> str:
    """``value`` in quotes, backslashes and spaces kept; ``repr`` for unprintable text."""
    if not isinstance(value, str):
        return repr(value)
    if not value.isprintable():
        return repr(value)  # control characters, line breaks: escaped so the line stays one
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    return repr(value)


def one_line(text: object, limit: int = 300) -> str:
    """``text`` on one line: line breaks (with their indentation) become one space; runs of
    spaces inside a line are kept, since they may be what the message is about."""
    flat = _LINE_BREAKS.sub(" ", str(text)).strip()
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def counted(count: int, noun: str) -> str:
    """``1 batch``, ``2 batches``, ``1 record``: a count and its noun, in the number it takes
    (an ``s``, or ``es`` after s, x, ch, sh)."""
    if count == 1:
        return f"{count} {noun}"
    plural = noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")
    return f"{count} {plural}"
