"""References from the code into the documentation, and what the repository may not cite.

* every ``docs/<page>.md#<anchor>`` written in src/, tests/, docs/, benchmarks/, examples/ or
  README.md (docstrings, comments, ``--help`` texts, the generated CLI reference) names a page
  that exists and an anchor that the page's headings produce (MkDocs' slugs, or an explicit
  ``{#id}``; on the Python API page, an object that a ``:::`` block documents);
* the repository cites no unpublished specification sections and no issue numbers: the
  behaviour is described on the docs pages the references point to.

The strict docs build (tests/test_docs.py) checks the Markdown links between pages.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SCANNED = ("src/", "tests/", "docs/", "benchmarks/", "examples/")
TOP = ("README.md", "CHANGELOG.md", "Makefile", "pyproject.toml")

REF = re.compile(r"(?<![\w/.])docs/((?:[\w-]+/)*[\w-]+\.md)(?:#([\w-]+(?:\.[\w-]+)*))?")
# built so that this file does not match itself
SECTION_SIGN = "\u00a7"
SPEC_CITE = re.compile(r"\bSPEC\b|" + SECTION_SIGN + r"\s?\d")
ISSUE = re.compile(r"\bissues?\s?#\s?\d+|\bissues?\s+\d+", re.I)
API_PAGE = "reference/api.md"


def _files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\n")
    keep = []
    for f in out:
        if f and (f.startswith(SCANNED) or f in TOP) and (ROOT / f).is_file():
            keep.append(ROOT / f)
    return keep


def _text(path: Path) -> str | None:
    if path.stat().st_size > 2_000_000:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def slugify(heading: str) -> str:
    """MkDocs' (Python-Markdown toc's) default slug of a heading's text."""
    import unicodedata

    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # links keep their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


@cache
def anchors(page: str) -> frozenset[str]:
    """The anchors of a docs page: its headings' ids, explicit ids, ``:::`` objects."""
    path = DOCS / page
    out: set[str] = set()
    fence = None
    for line in path.read_text(encoding="utf-8").splitlines():
        s = line.strip()
        m = re.match(r"(`{3,}|~{3,})", s)
        if fence is None and m:
            fence = m.group(1)
            continue
        if fence is not None:
            if s.startswith(fence):
                fence = None
            continue
        h = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if h:
            text = h.group(1)
            explicit = re.search(r"\{[^}]*#([\w.:-]+)[^}]*\}\s*$", text)
            if explicit:
                out.add(explicit.group(1))
                text = text[:explicit.start()]
            slug = slugify(text)
            n = 0
            while (slug if n == 0 else f"{slug}_{n}") in out:
                n += 1
            out.add(slug if n == 0 else f"{slug}_{n}")
        out.update(re.findall(r'\bid="([\w.:-]+)"', line))
        obj = re.match(r"^:::\s+([\w.]+)", s)
        if obj:
            out.add(obj.group(1))
    return frozenset(out)


def _api_anchor_ok(anchor: str) -> bool:
    """An API page anchor is an object that a ``:::`` block documents, or one of its members."""
    return any(anchor == o or anchor.startswith(o + ".") for o in anchors(API_PAGE))


def references() -> list[tuple[str, int, str, str | None]]:
    refs = []
    for path in _files():
        text = _text(path)
        if text is None or "docs/" not in text:
            continue
        rel = path.relative_to(ROOT).as_posix()
        for ln, line in enumerate(text.splitlines(), 1):
            for m in REF.finditer(line):
                refs.append((rel, ln, m.group(1), m.group(2)))
    return refs


def broken(refs) -> list[str]:
    bad = []
    for rel, ln, page, anchor in refs:
        where = f"{rel}:{ln}: docs/{page}" + (f"#{anchor}" if anchor else "")
        if not (DOCS / page).is_file():
            bad.append(f"{where} (no such page)")
        elif anchor and anchor not in anchors(page) and not (
                page == API_PAGE and _api_anchor_ok(anchor)):
            bad.append(f"{where} (no such anchor on the page)")
    return bad


def test_slugs_follow_mkdocs():
    assert slugify("The world in time") == "the-world-in-time"
    assert slugify("Training diagnostics (`--diagnostics raw,lag,finetune,returning`)") == \
        "training-diagnostics-diagnostics-rawlagfinetunereturning"
    assert slugify("Robust aggregators against model poisoning") == \
        "robust-aggregators-against-model-poisoning"


def test_references_point_at_pages_and_anchors():
    refs = references()
    assert len(refs) >= 200, "the code cites the docs pages by path and anchor"
    assert sum(1 for r in refs if r[0].startswith("src/")) >= 150
    bad = broken(refs)
    assert not bad, "broken references into the docs:\n" + "\n".join(bad[:50])


def test_a_wrong_anchor_or_page_is_caught():
    assert broken([("x.py", 1, "concepts/staleness.md", "the-staleness-state")]) == []
    assert broken([("x.py", 1, "concepts/staleness.md", "no-such-heading")])
    assert broken([("x.py", 1, "concepts/no-such-page.md", None)])
    assert broken([("x.py", 1, "reference/api.md", "sfg.no_such_module")])


def _offending(pattern: re.Pattern) -> list[str]:
    hits = []
    for path in _files():
        text = _text(path)
        if text is None:
            continue
        rel = path.relative_to(ROOT).as_posix()
        for ln, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{rel}:{ln}: {line.strip()[:120]}")
    return hits


@pytest.mark.parametrize("what, pattern", [("specification sections", SPEC_CITE),
                                            ("issue numbers", ISSUE)])
def test_no_unpublished_citations(what, pattern):
    hits = _offending(pattern)
    assert not hits, f"{what} cited (describe the behaviour, link its docs page):\n" + \
        "\n".join(hits[:50])


def test_citation_patterns_catch_what_they_should():
    spec, issue = "SP" + "EC", "iss" + "ue"
    assert SPEC_CITE.search(f"({spec} {SECTION_SIGN}2)") and SPEC_CITE.search(SECTION_SIGN + "4.1")
    assert ISSUE.search(f"({issue} 32)") and ISSUE.search(f"{issue.title()} #12")
    assert ISSUE.search(f"{issue}s 3, 4")
    assert not ISSUE.search("an issue with the 2 rounds") and not SPEC_CITE.search("SPECS")
