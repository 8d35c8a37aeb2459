"""The docs stay readable: no paragraph or list item of docs/*.md runs past what a reader takes in at once.

Tables and code blocks are exempt. The limit is the longest block the pages had after their rewrite into short
paragraphs and bullets (1,146 characters, docs/real-cluster.md), rounded up; a longer one is split by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.prose import SECTION_LIMIT, blocks, longest

DOCS = Path(__file__).resolve().parent.parent / "docs"
LIMIT = 1200  # characters of one paragraph or list item


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_no_paragraph_or_list_item_past_the_limit(page):
    size, block = longest((DOCS / page).read_text())
    assert size <= LIMIT, f"{page}: a block of {size} characters; split it into short paragraphs or bullets: {block[:200]}…"


def test_the_benchmarks_page_holds_the_sections_limit():
    """docs/performance.md, which the benchmarks write, holds their sections' tighter limit throughout."""
    long = [b for b in blocks((DOCS / "performance.md").read_text()) if len(b) > SECTION_LIMIT]
    assert not long, [b[:120] for b in long]


def test_blocks_leave_out_tables_code_and_headings():
    text = ("# Title\n\nA paragraph\nover two lines.\n\n- an item\n  continued\n- another\n  1. nested\n\n"
            "| a | b |\n|---|---|\n| 1 | 2 |\n\n```\ncode that is long\n```\n\n    indented code\n")
    assert blocks(text) == ["A paragraph over two lines.", "- an item continued", "- another", "1. nested"]
