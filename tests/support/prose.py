"""The prose of a Markdown text, block by block: paragraphs and list items, without tables, code and headings."""

from __future__ import annotations

import re

ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")


def blocks(text: str) -> list[str]:
    """Each paragraph and each list item (its continuation lines joined in) as one string; fenced and indented
    code, tables and headings left out."""
    out: list[str] = []
    current: list[str] = []

    def close() -> None:
        if current:
            out.append(" ".join(line.strip() for line in current))
            current.clear()

    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            close()
            fenced = not fenced
            continue
        if fenced or line.lstrip().startswith("|") or line.startswith("#"):
            close()
            continue
        if not line.strip():
            close()
            continue
        if line.startswith("    ") and not current:
            continue  # an indented code block
        if ITEM.match(line):
            close()
        current.append(line)
    close()
    return out


def longest(text: str) -> tuple[int, str]:
    """The length and the text of the longest block."""
    return max(((len(b), b) for b in blocks(text)), default=(0, ""))


SECTION_LIMIT = 600  # characters of one paragraph or list item in a section a benchmark writes


def check_section(text: str, heading: str) -> None:
    """A benchmark's generated section has the page's shape: its heading first, a table, and no paragraph or list
    item past SECTION_LIMIT characters."""
    assert text.startswith(heading + "\n\n"), text[:200]
    assert "\n|---" in text, "the section has no table"
    size, block = longest(text)
    assert size <= SECTION_LIMIT, f"a block of {size} characters: {block[:300]}…"
