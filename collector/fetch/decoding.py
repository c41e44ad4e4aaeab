"""Content-Encoding decoding that never holds more than the cap of decoded bytes.

httpx decodes a response (``aiter_bytes``) one network read at a time, each read whole: a gzip
bomb's 64 KB read becomes 64 MB in one call, before any size check can see it (on httpx's own
pool; on aiohttp's, reads of at most 16 KB still become ~16 MB). The engine reads the raw bytes
(``aiter_raw``) and decodes them here instead, each call bounded by what is left of
``max_response_bytes`` (zlib's ``decompress(data, max_length)``), so at most the cap plus one
decoded byte ever exists, whatever the compression ratio.

What is decoded is what httpx decodes: gzip and deflate (zlib, with httpx's fallback to a raw
deflate stream), br when a ``brotli`` with an output limit (1.2+) is installed, zstd when a
``zstd`` module with ``max_length`` (Python 3.14's ``compression.zstd``, ``backports.zstd``) is.
:data:`ACCEPT_ENCODING` asks servers for those only. Other values (``identity``, an encoding no
library here decodes, a bogus one) are left as they are, as httpx leaves them.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, Protocol

from collector.errors import PermanentFetchError

__all__ = ["ACCEPT_ENCODING", "BodyTooLarge", "BoundedDecoder", "bounded_decoder"]


class BodyTooLarge(Exception):
    """The decoded body would exceed the cap (the engine says so with its own message)."""


class _Stage(Protocol):
    def decode(self, data: bytes, max_length: int) -> bytes:
        """Up to ``max_length`` decoded bytes of ``data`` (more pending: the cap is hit)."""
        ...


class _Gzip:
    def __init__(self, wbits: int = zlib.MAX_WBITS | 16) -> None:
        self._inflate = zlib.decompressobj(wbits)

    def decode(self, data: bytes, max_length: int) -> bytes:
        return self._inflate.decompress(data, max_length)


class _Deflate:
    """zlib-wrapped deflate, or raw deflate when the first bytes say so (as httpx does)."""

    def __init__(self) -> None:
        self._inflate = zlib.decompressobj()
        self._first = True

    def decode(self, data: bytes, max_length: int) -> bytes:
        first, self._first = self._first, False
        try:
            return self._inflate.decompress(data, max_length)
        except zlib.error:
            if not first:
                raise
            self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
            return self._inflate.decompress(data, max_length)


def _brotli() -> Callable[[], _Stage] | None:
    try:
        import brotli  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    if not hasattr(brotli.Decompressor(), "can_accept_more_data"):
        return None  # before 1.2: no output limit, so not decoded (and not asked for)

    class _Brotli:
        def __init__(self) -> None:
            self._inflate: Any = brotli.Decompressor()

        def decode(self, data: bytes, max_length: int) -> bytes:
            out: bytes = self._inflate.process(data, output_buffer_limit=max_length)
            return out

    return _Brotli


def _zstd() -> Callable[[], _Stage] | None:
    try:
        from compression import zstd  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        try:
            from backports import zstd  # type: ignore[import-not-found, no-redef, unused-ignore]
        except ImportError:
            return None

    class _Zstd:
        def __init__(self) -> None:
            self._inflate: Any = zstd.ZstdDecompressor()

        def decode(self, data: bytes, max_length: int) -> bytes:
            if self._inflate.eof:
                return b""  # a second frame is ignored, as httpx's decoder ends at the first
            out: bytes = self._inflate.decompress(data, max_length)
            return out

    return _Zstd


_STAGES: dict[str, Callable[[], _Stage]] = {"gzip": _Gzip, "deflate": _Deflate}
for _name, _find in (("br", _brotli), ("zstd", _zstd)):
    if (_stage := _find()) is not None:
        _STAGES[_name] = _stage

ACCEPT_ENCODING = ", ".join(_STAGES)
"""The ``Accept-Encoding`` request header: the encodings this module decodes within a cap."""


class BoundedDecoder:
    """Decodes one response's body chunk by chunk; :class:`BodyTooLarge` past ``limit`` bytes.

    Encodings are undone last-applied first (``Content-Encoding: gzip, br``: br, then gzip);
    every stage is held to the same limit (an intermediate stage is still compressed, so
    smaller than the body).
    """

    __slots__ = ("_decoded", "_limit", "_stages")

    def __init__(self, stages: list[_Stage], limit: int) -> None:
        self._stages = stages
        self._limit = limit
        self._decoded = [0] * len(stages)

    def decode(self, data: bytes) -> bytes:
        """The decoded bytes of ``data`` (possibly none yet)."""
        try:
            for i, stage in enumerate(self._stages):
                if not data:
                    return b""
                room = self._limit - self._decoded[i]
                # One byte more than the room: getting it means the body is over the cap,
                # and all the input was consumed otherwise (zlib stops only when output is full).
                data = stage.decode(data, room + 1)
                self._decoded[i] += len(data)
                if self._decoded[i] > self._limit:
                    raise BodyTooLarge
        except BodyTooLarge:
            raise
        except Exception as exc:  # zlib.error, brotli.error, ZstdError: a corrupt body
            raise _undecodable(exc) from exc
        return data


def bounded_decoder(content_encoding: str | None, limit: int) -> BoundedDecoder | None:
    """A decoder for a response's ``Content-Encoding`` header, or None: the body is as sent."""
    if not content_encoding:
        return None
    names = [v.strip().lower() for v in content_encoding.split(",")]
    stages = [_STAGES[n]() for n in reversed(names) if n in _STAGES]
    return BoundedDecoder(stages, limit) if stages else None


def _undecodable(exc: BaseException) -> PermanentFetchError:
    return PermanentFetchError(f"cannot decode response body: {exc}", error_class="decode_error")
