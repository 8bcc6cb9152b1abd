"""Word count, the "hello world" of MapReduce, as a dyad-batch job module.

    dyad local --agents 3 &        # prints the master's address (default 127.0.0.1:5050)
    dyad-batch submit --master 127.0.0.1:5050 examples/wordcount.py \\
        --input 'examples/data/*.txt' --output /tmp/wordcount --reducers 2
    cat /tmp/wordcount/part-r-*

A job module defines `map` and `reduce`, and optionally `combine` and `partition`.
The executor calls `map(offset, line)` for every line of the map's input split
(`offset` is the line's byte offset in its file). Everything `map` yields is
grouped by key. `reduce(key, values)` is then called once per key, with the
values as an iterator, on the reduce task that owns the key's partition. Keys and
values must be JSON-serializable. `combine` has the same shape as `reduce` and
runs on each map's output before the shuffle, so the shuffle carries one count per
word and map instead of one per occurrence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

WORD = re.compile(r"[a-z0-9']+")


def words(line: str) -> list[str]:
    """The words of a line: lower-case runs of letters, digits and apostrophes."""
    return WORD.findall(line.lower())


def map(offset: int, line: str) -> Iterator[tuple[str, int]]:
    for word in words(line):
        yield word, 1


def combine(word: str, counts: Iterable[int]) -> Iterator[tuple[str, int]]:
    yield word, sum(counts)


def reduce(word: str, counts: Iterable[int]) -> Iterator[tuple[str, int]]:
    yield word, sum(counts)
