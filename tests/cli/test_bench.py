"""``linattn bench``: argument errors, and (slow) one small end-to-end run."""

from __future__ import annotations

import pytest

from linattn.cli import main
from linattn.ops import native


def test_bad_arguments_are_one_line_errors(capsys, tmp_path):
    assert main(["bench", "-T", "0", "--no-crossover"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "-T" in err and "positive" in err
    assert main(["bench", "-T", "64", "--plot", str(tmp_path / "nope" / "b.png")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_small_run_prints_the_tables_and_writes_the_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.png"
    code = main(["bench", "-T", "512", "-H", "2", "-d", "16", "--repeats", "1", "--no-portable",
                 "--crossover", "128", "256", "--plot", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert text.count("| torch |") == 4 and "roofline:" in text
    assert text.count("| native native |") == (4 if native.load() else 0)
    assert "| of peak |" in text and "core peak, native build:" in text
    assert "crossover, forward non-causal" in text
    assert out.read_bytes()[:4] == b"\x89PNG"
