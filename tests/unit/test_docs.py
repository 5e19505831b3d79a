"""The documentation points only at what exists, and the README reaches every page.

A reader follows a link or opens a path a page names (``src/...``,
``tests/...``); when a file moved or was never committed, the page is wrong
without anyone noticing. These tests read the Markdown the way a reader does:
relative links (and their ``#anchors``) from the page's own folder, repo
paths from the repository's root, and paths inside backticks that start with
``./`` or ``../`` from the page's folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: every Markdown file a user reads in the repository
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "examples" / "README.md",
        *(ROOT / "examples").glob("*/README.md"),
        ROOT / "benchmarks" / "README.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
#: a path from the repository's root, in prose or in backticks
REPO_PATH = re.compile(
    r"(?<![\w./$~-])((?:src|tests|benchmarks|examples|docs)/(?:[\w./*-]|\{[\w.,-]*\})*)"
)
BRACES = re.compile(r"\{([^{}]*)\}")
#: a relative path inside backticks, read from the page's folder
RELATIVE_PATH = re.compile(r"^\.{1,2}/[\w./*-]+$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def prose_lines(page: Path) -> Iterator[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered from 1."""
    fenced = False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text, lower case, punctuation dropped."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(page):
        found.update(HTML_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def expand(path: str) -> list[str]:
    """``results.{md,json}`` as the shell reads it: one path per alternative."""
    braces = BRACES.search(path)
    if braces is None:
        return [path]
    head, tail = path[: braces.start()], path[braces.end() :]
    return [name for part in braces.group(1).split(",") for name in expand(head + part + tail)]


def ignored(named: str, root: Path) -> bool:
    """A folder git ignores: a program's output (logs, scratch), not a file to commit."""
    gitignore = root / ".gitignore"
    if not gitignore.exists():
        return False
    folders = [
        line.strip().lstrip("/")
        for line in gitignore.read_text(encoding="utf-8").splitlines()
        if "/" in line.strip().rstrip("/") and not line.startswith("#")
    ]
    return any(named.startswith(folder) for folder in folders)


def exists(path: Path) -> bool:
    """The path, or for a glob (``tests/conformance/test_*.py``) one match."""
    if "*" in path.name or "*" in str(path.parent):
        relative = path.relative_to(path.anchor)
        return any(Path(path.anchor).glob(str(relative)))
    return path.exists()


def broken_references(page: Path, root: Path = ROOT) -> list[str]:
    """What on ``page`` names a file or an anchor that is not in the repository at ``root``."""

    def inside_repo(path: Path) -> bool:
        return path.resolve().is_relative_to(root.resolve())

    problems: list[str] = []
    where = page.relative_to(root)
    for number, line in prose_lines(page):
        spans = [match.group(2).strip() for match in CODE_SPAN.finditer(line)]
        outside_code = CODE_SPAN.sub("", line)
        for target in LINK.findall(outside_code):
            if SCHEME.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part) if file_part else page
            if not inside_repo(linked) or not exists(linked):
                problems.append(f"{where}:{number}: link to a missing file: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                problems.append(f"{where}:{number}: link to a missing heading: {target}")
        for text in [outside_code, *spans]:
            for match in REPO_PATH.finditer(text):
                named = match.group(1).rstrip(".")
                for one in expand(named):
                    if not exists(root / one) and not ignored(one, root):
                        problems.append(f"{where}:{number}: names a missing path: {one}")
        for span in spans:
            if RELATIVE_PATH.match(span):
                named_path = page.parent / span
                if not inside_repo(named_path) or not exists(named_path):
                    problems.append(f"{where}:{number}: names a missing path: {span}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_file_a_page_names_exists(page: Path) -> None:
    problems = broken_references(page)
    assert not problems, "\n".join(problems)


def test_the_readme_links_every_docs_page() -> None:
    """A page the README does not link is a page a new user never finds."""
    readme = ROOT / "README.md"
    linked = {
        (ROOT / target.partition("#")[0]).resolve()
        for _, line in prose_lines(readme)
        for target in LINK.findall(CODE_SPAN.sub("", line))
        if not SCHEME.match(target)
    }
    unlinked = [
        str(page.relative_to(ROOT))
        for page in sorted((ROOT / "docs").glob("*.md"))
        if page.resolve() not in linked
    ]
    assert not unlinked, "README.md links none of: " + ", ".join(unlinked)


def test_the_checker_finds_what_is_missing(tmp_path: Path) -> None:
    """The checks above can fail: a page naming absent files is caught, each by name."""
    (tmp_path / "docs").mkdir()
    (tmp_path / ".gitignore").write_text("*.pyc\nsrc/out/\n", encoding="utf-8")
    page = tmp_path / "docs" / "probe.md"
    page.write_text(
        "# A heading\n\n"
        "See [the guide](nosuch.md), [a section](#a-heading), [nowhere](#no-heading),\n"
        "`src/dumbwaiter/nosuch.py`, tests/nosuch/ and `../outside/the/repo`.\n"
        "`docs/probe.{md,txt}`, `src/out/log.txt` (git-ignored)\n"
        "```sh\ncat src/ignored/in/a/fence.py\n```\n",
        encoding="utf-8",
    )
    assert broken_references(page, root=tmp_path) == [
        "docs/probe.md:3: link to a missing file: nosuch.md",
        "docs/probe.md:3: link to a missing heading: #no-heading",
        "docs/probe.md:4: names a missing path: tests/nosuch/",
        "docs/probe.md:4: names a missing path: src/dumbwaiter/nosuch.py",
        "docs/probe.md:4: names a missing path: ../outside/the/repo",
        "docs/probe.md:5: names a missing path: docs/probe.txt",
    ]
