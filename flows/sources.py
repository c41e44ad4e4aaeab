"""How every flow and command names a source: a file path, or a ``CollectorSource`` block.

One resolver for all flows and for the ``collector`` command, so a source kept in a block (edited
in the UI) can be collected, triaged, monitored and watched for changes exactly like a file.
Prefect is imported only for block names, so checking a file stays instant.
"""

from __future__ import annotations

from pathlib import Path

from collector.config import Source, load_source

__all__ = ["BLOCK_PREFIXES", "block_name_of", "resolve_source", "source_reference"]

BLOCK_PREFIXES = ("block:", "collector-source/")
"""The forms naming a block (the same as ``blocks.source.BLOCK_PREFIXES``; a test keeps them
equal). Kept here too so a file path is recognised without importing Prefect."""


def block_name_of(source: str) -> str | None:
    """The block name a ``source`` parameter refers to, or None when it is a file path."""
    for prefix in BLOCK_PREFIXES:
        if source.startswith(prefix):
            return source[len(prefix) :].strip() or None
    return None


def resolve_source(source: str, *, deep: bool = True) -> Source:
    """A source from a file path, or from a ``CollectorSource`` block named
    ``block:<name>`` / ``collector-source/<name>`` (checked by the same model as a file;
    ``deep`` as for :func:`collector.config.parse_source`)."""
    name = block_name_of(source)
    if name is None:
        return load_source(Path(source).expanduser(), deep=deep)
    from blocks.source import CollectorSource
    from collector.config import SourceError, parse_source

    try:
        # _sync=True: the sync variant, so the result is the block (never a coroutine)
        block: CollectorSource = CollectorSource.load(name, _sync=True)  # type: ignore[call-arg,assignment]
    except ValueError as exc:  # Prefect: "Unable to find block document named ..."
        if "Unable to find" not in str(exc):
            raise SourceError([f"block {name!r}: {exc}"]) from None
        raise SourceError([f"block {name!r}: {_no_such_block(name)}"]) from None
    return parse_source(
        block.as_document(), label=f"block {name}", base_dir=block.base_path, deep=deep
    )


def _no_such_block(name: str) -> str:
    """What a user needs when ``block:NAME`` names nothing: which server was asked (the local
    background one, or theirs), the closest saved name, and how a block is saved. Prefect's
    own "Unable to find block document named X for block type collector-source" said none."""
    import difflib

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    saved: list[str] = []
    try:
        with get_client(sync_client=True) as client:
            documents = client.read_block_documents_by_type(
                "collector-source", include_secrets=False
            )
        saved = sorted(d.name for d in documents if d.name)
    except Exception:  # the listing is a courtesy: the line still says what is missing
        pass
    close = difflib.get_close_matches(name, saved, n=1, cutoff=0.6)
    where = f"no CollectorSource block of that name on {PREFECT_API_URL.value() or 'Prefect'}"
    how = f"`collector blocks save {name} SOURCE.yaml` saves one"
    if close:
        return f"{where}: did you mean block:{close[0]}? ({how})"
    if saved:
        listed = ", ".join(saved[:5]) + (", ..." if len(saved) > 5 else "")
        return f"{where} (saved there: {listed}); {how}"
    return f"{where}, where none is saved; {how}"


def source_reference(source: str) -> str:
    """How other flows can name this source again: a block name as given, a path made absolute."""
    if block_name_of(source) is not None:
        return source
    return str(Path(source).expanduser().resolve())
