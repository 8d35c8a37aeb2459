"""Counts in log lines as English: `1 partition`, `50 partitions`, `0 logs`."""

from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`count` and `noun`, in the plural (`nouns`, by default `noun + "s"`) unless `count` is exactly 1."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"
