"""Generated blocks of the docs: find the page (README.md or docs/*.md) that holds a block's
``<!-- NAME:start -->`` ... ``<!-- NAME:end -->`` markers and replace what lies between them.

The generators (``readme_table.py``, ``ort_matrix_table.py``) write through here, so a block can
move between pages without the scripts knowing where it is.

    >>> replace("a\\n<!-- x:start -->\\nold\\n<!-- x:end -->\\nb\\n", "x", "new")
    'a\\n<!-- x:start -->\\nnew\\n<!-- x:end -->\\nb\\n'
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def pages(root: Path = ROOT) -> list[Path]:
    """The pages that may hold generated blocks: README.md, then docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def page_with(name: str, root: Path = ROOT) -> Path:
    """The one page holding block NAME; SystemExit naming the pages searched when none or several do."""
    start, end = markers(name)
    found = [p for p in pages(root) if p.is_file() and start in (text := p.read_text()) and end in text]
    if len(found) != 1:
        raise SystemExit(f"opbridge: {len(found)} pages hold the {start} ... {end} markers. Got "
                         f"{[str(p) for p in found] or 'none'} among README.md and docs/*.md. Keep exactly one.")
    return found[0]


def section(text: str, name: str) -> str:
    """What lies between the markers of block NAME in TEXT (without the newlines around it)."""
    start, end = markers(name)
    if start not in text or end not in text:
        raise SystemExit(f"opbridge: no {start} ... {end} markers. Got a page without them. Add them.")
    return text.split(start, 1)[1].split(end, 1)[0].strip("\n")


def replace(text: str, name: str, body: str) -> str:
    """TEXT with the lines between the markers of block NAME replaced by BODY."""
    start, end = markers(name)
    section(text, name)  # the markers are there
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    return f"{before}{start}\n{body.strip(chr(10))}\n{end}{after}"


def write(name: str, body: str, page: Path | None = None, *, check: bool = False) -> bool:
    """Put BODY between the markers of block NAME in PAGE (default: the page holding them). With
    ``check``, write nothing and say whether the page already holds BODY there."""
    page = page or page_with(name)
    old = page.read_text()
    new = replace(old, name, body)
    if check:
        return new == old
    if new != old:
        page.write_text(new)
    return True


def table_main(block: str, render: Callable[[dict], str], default_json: Path, description: str,
               argv: list[str] | None = None) -> str:
    """The command line of a block generator: render a result JSON as block BLOCK, print it, and with
    ``--readme [PAGE]`` write it into the page holding its markers."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("json", nargs="?", default=str(default_json))
    parser.add_argument("--readme", nargs="?", const="", help=f"update the page holding the {block} markers "
                        "(default: found among README.md and docs/*.md)")
    args = parser.parse_args(argv)
    table = render(json.loads(Path(args.json).read_text()))
    if args.readme is not None:
        write(block, table, Path(args.readme) if args.readme else None)
    print(table)
    return table
