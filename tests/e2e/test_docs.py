"""The docs hold together: every relative link in the README and docs/
names a file of the repository and, with an anchor, a heading of that file
(as GitHub makes anchors of headings); and the end-to-end tier runs every
test file there is."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page):
    """The anchors GitHub gives a page's headings: lower case, punctuation
    but hyphens and underscores dropped, spaces as hyphens, repeats numbered."""
    seen, found = {}, set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        text = re.sub(r"[`*]", "", text)
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(page):
    """Each relative link of a page outside code blocks, with its line."""
    in_code = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if not re.match(r"[a-z]+:", target):
                yield number, target


def test_every_relative_link_and_anchor_of_the_docs_resolves():
    broken = []
    for page in PAGES:
        for number, target in links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}:{number}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where} (no such heading)")
    assert broken == [], "\n".join(broken)


def test_the_check_sees_a_broken_anchor_and_a_missing_file(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Where the engine's time goes\n\n[a](#where-the-engines-time-goes) [b](#nowhere) [c](gone.md)\n")
    assert "where-the-engines-time-goes" in anchors(page)
    assert [t for _, t in links(page)] == ["#where-the-engines-time-goes", "#nowhere", "gone.md"]


def test_the_end_to_end_tier_runs_every_test_file():
    """scripts/e2e names the files it runs: one left off its list would
    never run in the suite."""
    script = (REPO / "scripts" / "e2e").read_text()
    named = set(re.findall(r"\btest_\w+\.py\b", script))
    files = {p.name for p in (REPO / "tests" / "e2e").glob("test_*.py")}
    assert files - named == set(), "not run by scripts/e2e"
