"""The notebooks' shared helpers that need no job: the lines of a scenario, by number or text."""

from __future__ import annotations

import pytest

from rankscope.scenarios import get
from rankscope.widgets.lesson import show_lines


def test_show_lines_by_number_and_by_text(capsys):
    s = get("d21")
    lines = s.path.read_text().splitlines()
    show_lines(s, 2, 3)
    assert capsys.readouterr().out.splitlines() == [
        f"# {s.path.name}",
        f"  2  {lines[1]}",
        f"  3  {lines[2]}",
    ]
    first = next(i for i, t in enumerate(lines) if "import" in t)
    show_lines(s, "import", "import")
    out = capsys.readouterr().out.splitlines()
    assert out[1] == f"{first + 1:3}  {lines[first]}" and len(out) == 2
    with pytest.raises(ValueError, match="no line containing"):
        show_lines(s, "import", "a text that no scenario holds")
