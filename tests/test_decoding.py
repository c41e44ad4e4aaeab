"""The optional encodings (br, zstd) decode within the cap when their library is installed.

gzip and deflate are checked end to end against a real server in
tests/test_hostile_responses.py; br and zstd need ``brotli`` >= 1.2 or ``backports.zstd``
(Python 3.14's ``compression.zstd``), which Collector does not install: these skip without them.
Checked with brotli 1.2.1 and backports.zstd 1.8.0 (a unit test of one function, no transport).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest

from collector.errors import PermanentFetchError
from collector.fetch import decoding

CAP = 1_000_000
PAGE = b'{"id": 1, "name": "' + b"x" * 50_000 + b'"}'


def _compressor(encoding: str) -> Callable[[bytes], bytes]:
    if encoding == "br":
        brotli: Any = pytest.importorskip("brotli")
        if not hasattr(brotli.Decompressor(), "can_accept_more_data"):
            pytest.skip("brotli before 1.2 has no output limit")
        return brotli.compress  # type: ignore[no-any-return]
    try:
        zstd: Any = importlib.import_module("compression.zstd")
    except ImportError:
        zstd = pytest.importorskip("backports.zstd")
    return zstd.compress  # type: ignore[no-any-return]


@pytest.mark.parametrize("encoding", ["br", "zstd"])
def test_optional_encodings_decode_and_stop_at_the_cap(encoding: str) -> None:
    compress = _compressor(encoding)
    assert encoding in decoding.ACCEPT_ENCODING  # asked for only when decoded within the cap

    body = compress(PAGE)
    decoder = decoding.bounded_decoder(encoding, CAP)
    assert decoder is not None
    assert b"".join(decoder.decode(body[i : i + 100]) for i in range(0, len(body), 100)) == PAGE

    bomb = compress(b"\0" * (64 * CAP))
    decoder = decoding.bounded_decoder(encoding, CAP)
    assert decoder is not None
    with pytest.raises(decoding.BodyTooLarge):
        decoder.decode(bomb)

    decoder = decoding.bounded_decoder(encoding, CAP)
    assert decoder is not None
    with pytest.raises(PermanentFetchError, match=r"^cannot decode response body: "):
        decoder.decode(b"\x07" * 50)
