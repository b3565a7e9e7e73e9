"""Every code block of README.md and docs/*.md runs as written, in page order (README first).

- A python block whose first line is ``# name.py`` (a C++ block: ``// name.cc``, text after a colon
  allowed) is a file: written into the docs folder, a python file compiled.
- Any other python block runs in that folder with this interpreter, as ``python BLOCK``, a process of
  its own forked from tests/forkserver.py's server (the third-party imports done once); a bash block runs with
  ``bash -e -o pipefail`` there, where ``.venv`` links to the running venv (``sys.prefix``), so
  blocks say ``.venv/bin/opbridge ...`` as a user who followed the set-up types it. No bare
  ``opbridge``/``python``/``pip`` in a bash block.
- The folder stands for a clone: every top-level entry of the repository is linked into it (the
  C host block builds ``examples/...`` "from the repository root"); what the blocks write stays in
  the temp folder. Blocks share the files written before them, across pages.
- ``<!-- doc-test: skip (reason) -->`` right before a block: not run, listed with its reason in the
  test summary (``-ra``); ``<!-- doc-test: slow (reason) -->``: run only with ``-m slow``/``--heavy``.
  A ``text`` block is output shown, not code. Test ids are ``page:line`` of the opening fence.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import forkserver
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"python", "bash"}
FILES = {"python", "cpp"}
SHOWN = {"text"}
FENCE = re.compile(r"^```([\w+-]*)\n(.*?)^```[ \t]*$", re.S | re.M)
DIRECTIVE = re.compile(r"<!-- doc-test: (skip|slow) \((.+?)\) -->\s*\Z")
ANY_DIRECTIVE = re.compile(r"<!--\s*doc-test\b.*?-->", re.S)
FILE_LINE = re.compile(r"(?:#|//) ([\w.-]+\.(?:py|cc|cpp|h))(?:: .*)?$")
BARE = re.compile(r"(?:^|&&|\|\||;|\|)\s*(opbridge|python3?|pip3?)\b", re.M)
CI = ROOT / ".ci" / "run"


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    mark: str | None = None  # "skip" or "slow"
    reason: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"

    @property
    def file(self) -> str | None:
        """The file name a file block is written as; None for a block that runs."""
        first = self.code.split("\n", 1)[0]
        m = FILE_LINE.fullmatch(first)
        return m.group(1) if m and self.lang in FILES and m.group(0).startswith("#" if self.lang == "python"
                                                                                  else "//") else None


def page_blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found, end = [], 0
    for m in FENCE.finditer(text):
        d = DIRECTIVE.search(text[end:m.start()])
        found.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                           d.group(1) if d else None, d.group(2).strip() if d else None))
        end = m.end()
    return found


BLOCKS = [b for page in PAGES for b in page_blocks(page)]
CODE = [b for b in BLOCKS if b.lang not in SHOWN]


def doc_block(first_line: str, lang: str = "python") -> Block:
    """The one block of README.md or docs/*.md whose first line is FIRST_LINE (other tests read
    the blocks they check through here, wherever the block lives)."""
    (block,) = [b for b in BLOCKS if b.lang == lang and b.code.split("\n", 1)[0] == first_line]
    return block


@dataclass
class Result:
    ok: bool
    output: str = ""


def _tracked_top_level() -> list[str]:
    """The repository's own top-level entries (git's list; without git, what is there minus build
    outputs): a local dist/ or build/ is never linked, so the blocks' outputs stay in the temp folder."""
    r = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT)
    if r.returncode == 0 and r.stdout:
        names = {line.split("/", 1)[0] for line in r.stdout.splitlines()}
    else:
        names = {p.name for p in ROOT.iterdir() if p.name not in {"dist", "build"} and not p.name.endswith(".egg-info")}
    return sorted(n for n in names if not n.startswith(".") and (ROOT / n).exists())


class DocRun:
    """Runs the blocks in order, each once, on demand: a test runs the blocks before its own first
    (a skipped block is never run; a slow one only by its own test)."""

    def __init__(self, folder: Path):
        self.folder, self.results = folder, {}
        for name in _tracked_top_level():
            (folder / name).symlink_to(ROOT / name)
        (folder / ".venv").symlink_to(sys.prefix)

    def through(self, block: Block) -> Result:
        for b in CODE[:CODE.index(block)]:
            if b.id not in self.results and b.mark is None:
                self.results[b.id] = self.run(b)
        if block.id not in self.results:
            self.results[block.id] = self.run(block)
        return self.results[block.id]

    def run(self, block: Block) -> Result:
        if block.file:
            path = self.folder / block.file
            assert not path.is_symlink(), f"{block.id} would write over the repository's {block.file}"
            path.write_text(block.code)
            if block.lang == "python":
                compile(block.code, str(path), "exec")
            return Result(True)
        script = self.folder / f".doc_block_{block.id.replace('/', '_').replace(':', '_')}"
        script.write_text(block.code)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        if block.lang == "python":
            r = forkserver.run([str(script)], cwd=self.folder, env=env, timeout=600)
        else:
            r = subprocess.run(["bash", "-e", "-o", "pipefail", str(script)], capture_output=True, text=True,
                               cwd=self.folder, env=env, timeout=600)
        return Result(r.returncode == 0, r.stdout + r.stderr)


@pytest.fixture(scope="module")
def doc_run(tmp_path_factory):
    return DocRun(tmp_path_factory.mktemp("docs"))


def _param(b: Block):
    marks = [pytest.mark.slow] if b.mark == "slow" else []
    return pytest.param(b, id=b.id, marks=marks)


@pytest.mark.parametrize("block", [_param(b) for b in CODE])
def test_doc_block_runs(block, doc_run):
    if block.mark == "skip":
        pytest.skip(f"{block.id}: {block.reason}")
    result = doc_run.through(block)
    assert result.ok, f"{block.id} ({block.lang}) failed:\n{block.code}\n--- output ---\n{result.output[-4000:]}"


def test_every_block_is_known_and_every_directive_is_well_formed():
    assert CODE, "no code blocks found"
    unknown = [b.id for b in BLOCKS if b.lang not in RUN | FILES | SHOWN]
    assert not unknown, f"blocks of no known language (python, cpp, bash, text): {unknown}"
    cpp = [b.id for b in BLOCKS if b.lang == "cpp" and not b.file]
    assert not cpp, f"C++ blocks must start with '// name.cc' (they are files): {cpp}"
    for page in PAGES:
        text = page.read_text()
        for m in ANY_DIRECTIVE.finditer(text):
            assert DIRECTIVE.search(m.group(0)) and m.group(0).count("(") >= 1, \
                f"{page.name}: '{m.group(0)}' must read '<!-- doc-test: skip|slow (reason) -->'"
        placed = len([b for b in page_blocks(page) if b.mark])
        assert placed == len(ANY_DIRECTIVE.findall(text)), f"{page.name}: a doc-test comment not right before a block"


def test_shell_blocks_use_the_venvs_programs():
    bare = {b.id: m for b in CODE if b.lang == "bash"
            for m in BARE.findall(b.code.replace("python3 -m venv .venv", ""))}
    assert not bare, f"bare program names in shell blocks (write .venv/bin/NAME): {bare}"


def test_skipped_blocks_say_why(capsys):
    skipped = [b for b in CODE if b.mark]
    for b in skipped:
        assert b.reason and len(b.reason) > 10, f"{b.id}: give the reason it cannot run in the test"
    with capsys.disabled():
        print("\ndoc blocks not run by default:\n" + "\n".join(f"  {b.id} [{b.mark}] {b.reason}" for b in skipped))


def test_setup_blocks_are_what_ci_runs():
    ci = [line.strip() for line in CI.read_text().splitlines() if line.strip().startswith(("python3", ".venv/bin"))]
    setup = [b for b in CODE if b.code.startswith("python3 -m venv .venv")]
    assert len(setup) == 2 and all(b.mark == "skip" and b.page.name == "README.md" for b in setup)
    for b in setup:
        venv, pip, *rest = b.code.strip().split(" && ")
        assert venv == ci[0], (venv, ci[0])
        # the main job installs without the test extra; everything else is CI's command
        assert pip.replace(" -e .", ' -e ".[test]"') == ci[1], (pip, ci[1])
        if "pytest" in b.code:
            assert rest == [ci[2].replace(" -p no:cacheprovider", "")], (rest, ci[2])


def _shell_block(page: str, text: str) -> Block:
    (block,) = [b for b in CODE if b.lang == "bash" and b.page.name == page and text in b.code]
    return block


def test_user_op_passes_over_each_dtype_in_each_tier(doc_run):
    # the function tier and the python tier each run float32 and float64
    result = doc_run.through(_shell_block("README.md", "--ops my_ops check --op mine::clamp_scale --tier python"))
    assert result.ok and result.output.count("2 passed, 0 failed") == 2, result.output[-3000:]
    result = doc_run.through(_shell_block("ops.md", "--tier native"))
    assert result.ok and "2 passed, 0 failed" in result.output, result.output[-3000:]
    assert (doc_run.folder / "dist" / "manifest.json").is_file()


def test_use_example_passes_and_writes_the_file(doc_run):
    (use,) = [b for b in CODE if b.page.name == "README.md" and "case = demo.build()" in b.code]
    result = doc_run.through(use)
    assert result.ok, result.output[-3000:]
    assert "| PASS" in result.output and (doc_run.folder / "bev.onnx").exists()


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_pages_resolve():
    broken = []
    for page in PAGES:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            headings = {_anchor(h) for h in re.findall(r"^#+ (.*)$", FENCE.sub("", file.read_text()), re.M)} \
                if file.is_file() else set()
            if not file.exists() or (anchor and anchor not in headings):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, f"links to no file or no heading: {broken}"
