"""The one table renderer (cli/tables.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.tables import table


def test_text_table_pads_right_aligned_columns():
    assert table(["a", "bb"], [[1, "x"], [100, "yyy"]]).splitlines() == [
        "  a   bb", "---  ---", "  1    x", "100  yyy"]


def test_text_table_aligns_left_where_asked_and_formats_cells():
    text = table(["name", "n"], [["long name", 1.5]], align="<",
                 cell=lambda v: f"{v:.2f}" if isinstance(v, float) else str(v))
    assert text.splitlines() == ["name          n", "---------  ----",
                                 "long name  1.50"]


def test_markdown_table():
    assert table(["a", "b"], [[1, None]], style="markdown") == \
        "| a | b |\n|---|---|\n| 1 | None |"


@pytest.mark.parametrize("kw, match", [
    ({"style": "html"}, "style 'html': one of text, markdown"),
    ({"align": "<^"}, "align '<\\^'"),
    ({"align": "<<<"}, "at most 2"),
])
def test_bad_arguments_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        table(["a", "b"], [], **kw)


def test_a_short_row_is_refused():
    with pytest.raises(ValueError, match="row 0 has 1 cells, the header 2"):
        table(["a", "b"], [[1]])


@given(st.lists(st.lists(st.text(alphabet="ab |-", max_size=6), min_size=3,
                         max_size=3), max_size=5))
def test_text_lines_are_equally_wide(rows):
    lines = table(["x", "yy", "zzz"], rows).splitlines()
    assert len(lines) == len(rows) + 2
    assert len({len(line) for line in lines}) == 1
