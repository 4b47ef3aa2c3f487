"""The notebooks' shared helpers that need no job: the lines of a scenario, by number or text."""

from __future__ import annotations

import pytest

from rankscope.scenarios import get
from rankscope.widgets.lesson import line_of, needs, show_lines


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


def test_show_lines_and_line_of_a_script_of_the_notebooks_own(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("import torch\nif rank == 0:\n    evaluate()\n")
    show_lines(script)
    assert capsys.readouterr().out.splitlines() == [
        "# train.py",
        "  1  import torch",
        "  2  if rank == 0:",
        "  3      evaluate()",
    ]
    assert line_of(script, "if rank == 0:") == "train.py:2"
    assert line_of(get("d21"), "import") == f"{get('d21').path.name}:{_first_import()}"
    with pytest.raises(ValueError, match="no line containing"):
        line_of(script, "dist.barrier()")


def _first_import() -> int:
    lines = get("d21").path.read_text().splitlines()
    return next(i for i, t in enumerate(lines, 1) if "import" in t)


def test_needs_says_which_package_is_missing_and_how_to_install_it(capsys):
    assert needs("json", "os")
    assert capsys.readouterr().out == ""
    assert not needs("json", "rankscope_no_such_package")
    out = capsys.readouterr().out
    assert "rankscope_no_such_package" in out and "json" not in out
    assert "pip install -e '.[frameworks]'" in out
