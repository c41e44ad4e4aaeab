"""collector._text: how counts and values read inside one-line messages."""

from __future__ import annotations

import pytest

from collector._text import counted


@pytest.mark.parametrize(
    ("count", "noun", "said"),
    [
        (0, "batch", "0 batches"),
        (1, "batch", "1 batch"),
        (2, "batch", "2 batches"),
        (1, "record", "1 record"),
        (3, "record", "3 records"),
        (2, "box", "2 boxes"),
        (2, "class", "2 classes"),
    ],
)
def test_a_count_takes_its_noun_in_the_number_it_needs(count: int, noun: str, said: str) -> None:
    assert counted(count, noun) == said
