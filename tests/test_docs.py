"""The docs live in the repository, and every pointer into them lands (issue 23, item 4).

Source, tests and the README cite the design notes by file and section ("docs/protocol.md
section 8", "docs/design.md, Durability"). These tests read the files as text (no import runs)
and hold:

- every citation names a page under ``docs/`` that exists (never a folder beside the checkout,
  which a user's clone does not have);
- every numbered protocol section cited exists, and each number keeps its topic, so a
  citation written against one version of the page still points at the right rules;
- every named section ("docs/design.md, Durability") is a heading of that page;
- every relative link of the README and of ``docs/`` reaches a file;
- every source file a page names (``collector/dispatch/retry.py``) exists, so the newcomer's map
  cannot drift from the tree;
- the architecture page names every package under ``src/trollout``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "trollout"
# The pages the code cites by their old names (beside the checkout) and the pages of docs/.
PAGE_NAMES = ("design", "protocol", "style", *(p.stem for p in DOCS.glob("*.md")))
PAGE_NAMES = tuple(name for name in PAGE_NAMES if name != "README")  # README.md is not a page
# protocol.md's sections: the code cites them by number, so each number keeps its topic.
PROTOCOL_SECTIONS = {
    1: "Finding the servers",
    2: "`POST /run`",
    3: "Environment servers and episodes",
    4: "`POST /aggregate_metrics`",
    5: "Preprocessing",
    6: "Concurrency, retries, timeouts",
    7: "The run folder",
    8: "Resume, attempts, aggregation",
    9: "Budget, drain, timing report",
    10: "NeMo Gym command line",
}


def cited_files() -> Iterator[Path]:
    """Yield the files that may cite the docs: source, tests, README, bench, examples."""
    yield ROOT / "README.md"
    for folder in ("src", "tests", "bench", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path != Path(__file__).resolve():
                yield path


def flat(text: str) -> str:
    """Return `text` as one line: a citation may wrap, also across ``#`` comment lines."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)


def citations() -> Iterator[tuple[Path, str, str]]:
    """Yield (file, page, what follows) for every mention of a docs page by name."""
    names = "|".join(sorted(set(PAGE_NAMES), key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.-])((?:[\w./-]*/)?(?:{names})\.md)\b(?=(.{{0,40}}))")
    for path in cited_files():
        for match in pattern.finditer(flat(path.read_text(encoding="utf-8"))):
            yield path, match.group(1), match.group(2)


def headings(page: Path) -> list[str]:
    """Return the text of every markdown heading of a page."""
    lines = page.read_text(encoding="utf-8").splitlines()
    return [line.lstrip("#").strip() for line in lines if line.startswith("#")]


def test_docs_every_citation_names_a_page_in_docs() -> None:
    """Source, tests and README cite ``docs/<page>.md``, and the page exists."""
    wrong = [
        f"{path.relative_to(ROOT)}: {page}"
        for path, page, _ in citations()
        if not page.startswith("docs/") or not (ROOT / page).is_file()
    ]
    assert wrong == []


def test_docs_protocol_sections_keep_their_numbers_and_topics() -> None:
    """protocol.md has sections 1 to 10, each on the topic the code cites it for."""
    numbered = {}
    for heading in headings(DOCS / "protocol.md"):
        match = re.match(r"(\d+)\. (.*)", heading)
        if match:
            numbered[int(match.group(1))] = match.group(2)
    assert sorted(numbered) == sorted(PROTOCOL_SECTIONS)
    for number, topic in PROTOCOL_SECTIONS.items():
        assert numbered[number].startswith(topic), (number, numbered[number])


def test_docs_every_cited_protocol_section_exists() -> None:
    """Cited protocol sections exist: "section 8", "sections 2 and 7", "sections 1 to 4"."""
    sections = re.compile(r"^,?\s*(?:sections?\s+)?(\d+(?:\s*(?:,|and|to|-)\s*\d+)*)")
    cited = 0
    for path, page, after in citations():
        match = sections.match(after) if page.endswith("protocol.md") else None
        for number in re.findall(r"\d+", match.group(1)) if match else ():
            cited += 1
            assert int(number) in PROTOCOL_SECTIONS, f"{path.relative_to(ROOT)}: {number}"
    assert cited > 40  # the guard sees the citations (about sixty today)


def test_docs_every_cited_named_section_is_a_heading() -> None:
    """ "docs/design.md, Durability" names a heading of design.md."""
    named = re.compile(r"^,\s*([A-Z][a-z]+(?: [a-z]+)*)")
    for path, page, after in citations():
        match = named.match(after)
        if match and (ROOT / page).is_file():
            titles = headings(ROOT / page)
            assert any(match.group(1) in title for title in titles), (
                f"{path.relative_to(ROOT)}: {page}, {match.group(1)}"
            )


def test_docs_relative_links_reach_files() -> None:
    """Every relative markdown link of the README and docs/ names a file that exists."""
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    broken = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target in link.findall(page.read_text(encoding="utf-8")):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_docs_name_only_source_files_that_exist() -> None:
    """A page naming ``collector/dispatch/retry.py`` (or ``tests/...``) names a file of the tree."""
    named = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.py)`")
    bases = (ROOT, SRC, ROOT / "src")
    missing = []
    for page in sorted(DOCS.glob("*.md")):
        for name in named.findall(page.read_text(encoding="utf-8")):
            if not any((base / name).is_file() for base in bases):
                missing.append(f"{page.name}: {name}")
    assert missing == []


def test_docs_architecture_names_every_package() -> None:
    """The architecture page lists every package under src/trollout, so none goes unmapped."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    packages = sorted(p.parent.name for p in SRC.glob("*/__init__.py"))
    assert packages, "no package found"
    assert [p for p in packages if f"`{p}/`" not in text] == []


def test_docs_pages_do_not_point_beside_the_checkout() -> None:
    """No page or README sends a reader to ``../shared``: a user's clone has none."""
    pages = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    assert [p.name for p in pages if "../shared" in p.read_text(encoding="utf-8")] == []
