"""Every relative link in the repository's Markdown (README.md, docs/, the roles', lab/'s, bench/'s, ...)
points at a file or folder that exists, and its `#anchor`, if any, at a heading of the Markdown file it
names (GitHub's anchors: the heading lowercased, punctuation dropped, spaces made hyphens, `-1`, `-2` for
repeats)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"build", "dist", "node_modules"}  # and every hidden folder (.venv, .git, .demo, caches)

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
CODE_SPAN = re.compile(r"(`+).+?\1")
INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files() -> list[Path]:
    return sorted(
        p
        for p in ROOT.rglob("*.md")
        if not any(part.startswith(".") or part in SKIP_DIRS for part in p.relative_to(ROOT).parts[:-1])
    )


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    out, fenced = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((n, line))
    return out


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in prose_lines(path):
        out.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    out = []
    for n, line in prose_lines(path):
        text = CODE_SPAN.sub("", line)
        out += [(n, target) for target in INLINE_LINK.findall(text) + REFERENCE_DEF.findall(text)]
    return out


def broken(path: Path, target: str, cache: dict[Path, set[str]]) -> str | None:
    """Why the relative link `target` in `path` does not resolve, or None."""
    if SCHEME.match(target) or target.startswith("//"):
        return None  # a URL elsewhere: not this test's business
    file_part, _, anchor = target.partition("#")
    dest = (path.parent / file_part).resolve() if file_part else path
    if not dest.exists():
        return "no such file"
    if ROOT not in dest.parents and dest != ROOT:
        return "outside the repository"
    if anchor and dest.suffix == ".md":
        if dest not in cache:
            cache[dest] = anchors(dest)
        if anchor not in cache[dest]:
            return f"no heading #{anchor} in {dest.relative_to(ROOT)}"
    return None


def test_markdown_files_are_found():
    found = {p.relative_to(ROOT).as_posix() for p in markdown_files()}
    assert {"README.md", "docs/configuration.md", "roles/ocr_app/README.md"} <= found


def test_relative_links_resolve():
    cache: dict[Path, set[str]] = {}
    bad = [
        f"{path.relative_to(ROOT)}:{n}: ({target}): {why}"
        for path in markdown_files()
        for n, target in links(path)
        if (why := broken(path, target, cache))
    ]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_slug_is_githubs():
    heading = "Canary share (entry points `canary` and `traffic`)"
    assert slug(heading) == "canary-share-entry-points-canary-and-traffic"
    assert slug("`GET /healthz`, `GET /livez`, `GET /metrics`") == "get-healthz-get-livez-get-metrics"
    assert slug("The web page: `GET /`") == "the-web-page-get-"
