"""The Markdown the repository keeps renders as written (a linter in the suite, with the CommonMark
parser rich already brings, `markdown-it-py`, its GFM tables on): every table renders as one
table with every row, no row has more cells than its header, every relative link and image
names a file that exists, and the README stays a page a newcomer reads (at most 250 lines)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    ROOT / p for p in subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True,
                                     text=True, check=True).stdout.split()
)
md = MarkdownIt("commonmark").enable("table")


def _cells(row: str) -> int:
    return len(re.split(r"(?<!\\)\|", row.strip().strip("|")))


def _written_tables(text: str) -> list[list[str]]:
    """Runs of table lines (a header, its `|---|` rule, rows), outside code fences."""
    runs: list[list[str]] = []
    fenced, run = False, []
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            run.append(line)
            continue
        if len(run) >= 2 and set(run[1].replace("|", "").strip()) <= set("-: "):
            runs.append(run)
        run = []
    return runs


def table_problems(text: str) -> list[str]:
    tokens = md.parse(text)
    runs = _written_tables(text)
    out = []
    rendered = sum(t.type == "table_open" for t in tokens)
    if rendered != len(runs):
        out.append(f"{len(runs)} tables written, {rendered} render")
    rows = sum(t.type == "tr_open" for t in tokens)
    if rows != sum(len(r) - 1 for r in runs):
        out.append(f"{sum(len(r) - 1 for r in runs)} table rows written, {rows} render")
    for run in runs:
        out += [f"more cells than the header: {row[:60]}" for row in run[2:] if _cells(row) > _cells(run[0])]
    # a table cut by a blank line: the rows after it render as a paragraph of pipes
    out += [f"a table row outside any table: {t.content[:60]}" for t in tokens
            if t.type == "inline" and t.content.startswith("|") and t.content.count("|") >= 3]
    return out


def link_problems(path: Path, text: str) -> list[str]:
    out = []
    for token in md.parse(text):
        for child in token.children or []:
            target = child.attrs.get("href") or child.attrs.get("src")
            if isinstance(target, str) and not re.match(r"^[a-z]+:|^#", target):
                if not (path.parent / target.split("#")[0]).exists():
                    out.append(f"no such file: {target}")
    return out


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_document_renders_as_written(path: Path) -> None:
    text = path.read_text()
    assert table_problems(text) + link_problems(path, text) == []


def test_the_linter_finds_what_it_looks_for(tmp_path: Path) -> None:
    bad = (
        "| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n\n"  # a blank line cuts the table
        "| x | y |\n|---|---|\n| 1 | 2 | 3 |\n\n"  # a row wider than its header
        "[gone](nothing-here.md) ![pic](pictures/none.png) [web](https://example.com) [here](#top)\n"
    )
    assert any("outside any table" in p for p in table_problems(bad))
    assert any("more cells than the header" in p for p in table_problems(bad))
    assert link_problems(tmp_path / "doc.md", bad) == ["no such file: nothing-here.md",
                                                        "no such file: pictures/none.png"]


def test_the_readme_is_a_page_a_newcomer_reads() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_the_architecture_lists_every_module_that_states_its_invariants() -> None:
    """docs/architecture.md's "Where the invariants live" names exactly the modules whose
    docstring has an Invariants section: a new one is added there, a moved one follows."""
    import ast

    code = ["chain/*.py", "stores/*.py", "workers/*.py", "tasks/*.py", "celeryconfig.py"]
    files = subprocess.run(["git", "ls-files", *code], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()

    def doc(f: str) -> str:
        return ast.get_docstring(ast.parse((ROOT / f).read_text())) or ""

    stating = {f for f in files if "Invariants" in doc(f)}
    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"^\| `([^`]+\.py)` \|", text.split("## Where the invariants live", 1)[1], re.M))
    assert stating, "no module found: the test reads the wrong files"
    assert listed == stating, {"unlisted": sorted(stating - listed), "not stating": sorted(listed - stating)}
