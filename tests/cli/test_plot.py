"""``linattn plot feature-maps``."""

from __future__ import annotations

import pytest

from linattn.cli import main

pytest.importorskip("matplotlib")


def test_writes_a_png(tmp_path):
    out = tmp_path / "maps.png"
    assert main(["plot", "feature-maps", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000
    assert [p.name for p in tmp_path.iterdir()] == ["maps.png"]  # no temporary left behind


def test_missing_folder_is_a_one_line_error(tmp_path, capsys):
    assert main(["plot", "feature-maps", "-o", str(tmp_path / "nope" / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and len(err.strip().splitlines()) == 1
