"""Every relative link in README.md and docs/*.md resolves: the file (or folder) it names
exists in the checkout, and a ``#anchor`` names a heading of the target page (GitHub's
slugs). Links inside code blocks and inline code are not links; web addresses are not walked."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: ``[text](target)`` and ``![alt](target)``; the target up to whitespace or ``)``, an
#: optional ``"title"`` after it.
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")


def prose_lines(text: str):
    """(line number, line) of the lines outside fenced code blocks, inline code removed."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, INLINE_CODE.sub("", line)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup and punctuation dropped, lower case, spaces to
    hyphens (letters, digits, ``_`` and ``-`` kept, in any script)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    kept = "".join(c for c in text
                   if c in " -_" or unicodedata.category(c)[0] in ("L", "N"))
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, repeated headings numbered as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path):
    for number, line in prose_lines(page.read_text(encoding="utf-8")):
        for m in LINK.finditer(line):
            yield number, m.group(1)


def test_the_pages_are_there():
    assert (ROOT / "README.md").is_file()
    assert len(PAGES) > 5


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    bad = []
    for number, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            bad.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{where}: no heading with this anchor in {dest.name}")
    assert not bad, "\n".join(bad)


def test_slugs_follow_github():
    assert slug("Decoding: recurrent state vs KV cache") == "decoding-recurrent-state-vs-kv-cache"
    assert slug("`linattn solve`") == "linattn-solve"
    assert slug("The softmax baseline's kernel: the ALiBi bias") == (
        "the-softmax-baselines-kernel-the-alibi-bias")
    assert slug("Gated delta rule: training and per-key gates") == (
        "gated-delta-rule-training-and-per-key-gates")


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Title\n\n## Part two\n", encoding="utf-8")
    page.write_text("[ok](b.md#part-two) [gone](c.md) `[code](c.md)`\n```\n[x](d.md)\n```\n"
                    "[anchor](b.md#part-three)\n", encoding="utf-8")
    found = list(links(page))
    assert [t for _, t in found] == ["b.md#part-two", "c.md", "b.md#part-three"]
    assert anchors(tmp_path / "b.md") == {"title", "part-two"}
