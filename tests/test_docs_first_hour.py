"""What a new user meets first in README and docs (issue #45): prerequisites where set-up is, words a user
knows, claims the commands keep, pages that stand alone."""

import re
import sys
from pathlib import Path

from test_doc_blocks import CODE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end >= 0 else None]


def test_setup_names_the_compiler_it_needs():
    setup = _section((ROOT / "README.md").read_text(), "## Set up")
    assert "C++ compiler" in setup and "g++" in setup and "apt-get install g++" in setup, setup


def test_no_page_speaks_of_seed_numbers():
    said = [f"{p.name}: {m}" for p in PAGES for m in re.findall(r"[^\n]*seed-\d+[^\n]*", p.read_text())]
    assert said == []


def test_only_opbridge_inline_is_said_to_print_both_node_counts():
    # `opbridge export --inline` prints the file written; `opbridge inline` prints "N -> M nodes"
    text = " ".join((ROOT / "docs" / "tiers.md").read_text().split())
    claim = re.search(r"\(([^()]*) prints? both counts\)", text)
    assert claim and claim.group(1) == "`opbridge inline`", claim and claim.group(1)


def test_toolchain_page_makes_its_files_and_names_its_tools():
    page = (ROOT / "docs" / "toolchain.md").read_text()
    (make,) = [b for b in CODE if b.page.name == "toolchain.md" and "export" in b.code and b.lang == "bash"]
    for name in ("bev.onnx", "demo.onnx", "dist", "demo_inline.onnx"):
        assert name in make.code, name
    assert CODE.index(make) == min(CODE.index(b) for b in CODE if b.page.name == "toolchain.md" and not b.file)
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    tools = [r for r in extra if r.split(">")[0].split("<")[0] in ("onnxsim", "onnxslim", "onnx-graphsurgeon",
                                                                  "polygraphy")]
    assert len(tools) == 4
    line = next(line for line in page.splitlines() if "pip install" in line and "onnxsim" in line)
    assert all(f'"{t}"' in line for t in tools), line
