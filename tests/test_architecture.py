"""The layering of ARCHITECTURE.md holds: import-linter contracts, every module in a layer, no facade use."""

import ast
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from radon import complexity as radon_complexity
from radon import visitors as radon_visitors

try:
    import tomllib
except ImportError:  # Python 3.10: the test extra installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("bridge", "exporters", "ort_kernels")


def _modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_import_linter_contracts_are_kept():
    # NOTE: import-linter (grimp) reads imports inside functions too: a hidden upward import breaks it
    r = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                        "sys.exit(lint_imports(config_filename='pyproject.toml'))"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "BROKEN" not in r.stdout and r.stdout.count("KEPT") == len(_contracts())


def _layered() -> set[str]:
    named = set()
    for contract in (c for c in _contracts() if c["type"] == "layers"):
        prefixes = [f"{c}." for c in contract.get("containers", [])] or [""]
        named |= {p + m.strip() for p in prefixes for layer in contract["layers"] for m in layer.split("|")}
    return named


def test_every_library_module_sits_in_a_layer():
    named = _layered()
    folders = {m for p in LIBRARY for m, path in _modules(p).items() if path.name == "__init__.py"}
    loose = [m for p in LIBRARY for m in _modules(p) if m not in named | folders and m != "bridge.__main__"]
    assert not loose, f"modules outside every layer of pyproject.toml: {loose}"


def test_folders_are_floors():
    # NOTE: the first contract orders whole folders; every library folder (subfolders count as their
    # own) is one floor of it, so no folder can import a folder that imports it.
    # A folder inside a floor (exporters/derive) cannot be a floor too (import-linter's layers do not
    # nest): it is a layer of its floor's inner contract and the container of one of its own.
    contracts = [c for c in _contracts() if c["type"] == "layers"]
    floors = contracts[0]["layers"]
    folders = {m for p in LIBRARY for m, path in _modules(p).items() if path.name == "__init__.py"} - {"bridge"}
    containers = {c for contract in contracts for c in contract.get("containers", [])}
    inner = {f"{c}.{m.strip()}" for contract in contracts for c in contract.get("containers", [])
             for layer in contract["layers"] for m in layer.split("|")}
    nested = {f for f in folders if f.rpartition(".")[0] in floors and f in inner and f in containers}
    assert folders - nested == set(floors), f"library folders {sorted(folders)} vs floors {floors}"


@pytest.mark.parametrize("package", LIBRARY)
def test_library_modules_never_import_the_facade_nor_hide_project_imports(package):
    # NOTE: the facade loads names with importlib, which import-linter cannot see; a library
    # module importing it would depend on every layer at once.
    problems = []
    for name, path in _modules(package).items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name == "bridge" for a in node.names) or \
                    isinstance(node, ast.ImportFrom) and node.module == "bridge" and node.level == 0:
                problems.append(f"{name}:{node.lineno} imports the facade")
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIBRARY + ("custom_ops",):
                    problems.append(f"{name}:{node.lineno} imports {node.module} inside {fn.name}()")
    assert not problems, problems


# NOTE: each shared concern has one module (ARCHITECTURE.md); these scans make a second copy fail
# (torch._check is public API despite its name: torch documents it for user code).
# (a private name anywhere in a dotted torch path counts: torch.nn.modules.batchnorm._BatchNorm)
_PRIVATE_TORCH = re.compile(r"torch\._(?!check\b)[A-Za-z]|from torch\._|torch\.utils\._|torch\.onnx\._internal|"
                            r"\btorch(\.[A-Za-z]\w*)+\._[A-Za-z]|"
                            r"\._schema\b|\._overloadname\b|\._init_fn\b|\bOPDEFS\b|\._opoverload\b|\._abstract_fn\b|"
                            r"\._lib\._destroy|\._backward_fn\b")
_GRAPH_WALK = re.compile(r"AttributeProto\.GRAPHS?\b|\.HasField\(\"g\"\)|\battr\.g\b|\ba\.g\b|\.graphs\)")


def _scan(pattern: re.Pattern, allowed: set[str]) -> list[str]:
    hits = []
    for package in (*LIBRARY, "custom_ops"):
        for path in _modules(package).values():
            if str(path.relative_to(ROOT)) in allowed:
                continue
            for lineno, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line.split("#", 1)[0]) and not line.lstrip().startswith(("#", ">>>")):
                    hits.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    return hits


def test_private_torch_api_only_in_torch_compat():
    hits = _scan(_PRIVATE_TORCH, {"bridge/core/basics/torch_compat.py"})
    assert not hits, "private torch API outside bridge/core/basics/torch_compat.py:\n" + "\n".join(hits)


@pytest.mark.parametrize("line", ["return op._backward_fn is not None",
                                  "_MODE = (torch.nn.modules.batchnorm._BatchNorm, nn.Dropout)",
                                  "import torch._library.custom_ops as c", "torch.utils._pytree.tree_map(f, x)"])
def test_private_torch_reads_are_seen(line):
    assert _PRIVATE_TORCH.search(line)


@pytest.mark.parametrize("line", ["torch._check(n > 0)", "torch.nn.modules.conv.Conv2d", "torch.ops.aten.relu.default"])
def test_public_torch_reads_are_not_flagged(line):
    assert not _PRIVATE_TORCH.search(line)


_ONNXSCRIPT_IR = re.compile(r"from onnxscript import .*\bir\b|onnxscript\.ir\b")


def test_onnx_ir_is_imported_one_way():
    # NOTE: onnxscript.ir re-exports onnx_ir (the same classes): one spelling, so a grep finds every use
    hits = _scan(_ONNXSCRIPT_IR, set())
    assert not hits, "onnx-ir imported through onnxscript (import onnx_ir as ir):\n" + "\n".join(hits)
    assert _ONNXSCRIPT_IR.search("from onnxscript import ir") and _ONNXSCRIPT_IR.search("import onnxscript.ir as ir")


def test_graph_walks_only_in_graphs():
    hits = _scan(_GRAPH_WALK, {"bridge/core/basics/graphs.py"})
    assert not hits, "graph walks outside bridge/core/basics/graphs.py:\n" + "\n".join(hits)


# -- the folder graph: no cycle, counting modules named by a string (importlib, a --model default) --------------

_FOLDERS = ("bridge.core", "bridge.tools", "exporters", "ort_kernels", "custom_ops", "bridge")  # most specific first
_MODULE_NAME = re.compile(r"^(bridge|exporters|ort_kernels|custom_ops)(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?$")


def _folder(module: str) -> str | None:
    """The folder (floor) ``module`` sits in: a subfolder counts as its floor (exporters.derive: exporters)."""
    return next((f for f in _FOLDERS if module == f or module.startswith(f + ".")), None)


def _docstrings(tree: ast.AST) -> set[int]:
    owners = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    firsts = [o.body[0] for o in owners if o.body]  # type: ignore[attr-defined]
    return {id(f.value) for f in firsts if isinstance(f, ast.Expr) and isinstance(f.value, ast.Constant)}


def _named_modules(tree: ast.AST) -> set[str]:
    """The project modules ``tree`` imports, or names in a string (a module imported at run time by name)."""
    docs, out = _docstrings(tree), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                and _MODULE_NAME.match(node.value):
            out.add(node.value.partition(":")[0])
    return out


def _folder_graph(folder: Callable[[str], str | None] = _folder) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {f: set() for f in _FOLDERS}
    for package in (*LIBRARY, "custom_ops"):
        for name, path in _modules(package).items():
            source = folder(name)
            for target in map(folder, _named_modules(ast.parse(path.read_text(), str(path)))):
                if source and target and target != source:
                    graph.setdefault(source, set()).add(target)
    return graph


_PACKAGES = {name for p in (*LIBRARY, "custom_ops") for name, path in _modules(p).items() if path.name == "__init__.py"}


def _package(module: str) -> str | None:
    """The folder ``module`` sits in, each subfolder its own (bridge.core.checks.guards: bridge.core.checks); the
    lazy facade ``bridge`` is left out (it names every floor's modules by string, loading none)."""
    while module and module not in _PACKAGES:
        module = module.rpartition(".")[0]
    return module if module and module != "bridge" else None


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """A cycle of ``graph`` (its nodes, the first repeated at the end), or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state:
                found = visit(nxt, path + [node])
                if found:
                    return found
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [])
            if found:
                return found
    return []


def test_cycle_finder_finds_a_cycle_through_a_module_named_by_a_string():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    tree = ast.parse('"""custom_ops in a docstring"""\nimport importlib\nimportlib.import_module("custom_ops")\n'
                     'DEFAULT = "custom_ops.demo:build"\nHELP = "custom_ops is always loaded"\n')
    assert _named_modules(tree) == {"importlib", "custom_ops", "custom_ops.demo"}


def test_the_folder_graph_has_no_cycle():
    # NOTE: the seed ops and the CLI's demo are named in pyproject.toml's entry points (bridge/tools/preflight.py),
    # not in the library: custom_ops -> bridge, never back
    graph = _folder_graph()
    assert "bridge" in graph["custom_ops"] and "custom_ops" not in set().union(*(graph[f] for f in _FOLDERS[:-2]))
    assert not _cycle(graph), f"folder cycle {' -> '.join(_cycle(graph))} ({graph})"


def test_no_subfolder_imports_back_into_a_folder_above_it():
    # NOTE: a subfolder is a floor of its own too: bridge/core/checks builds on bridge/core/basics, and nothing in
    # basics or checks imports the rest of bridge/core
    graph = _folder_graph(_package)
    assert graph["bridge.core.checks"] and "bridge.core" not in graph["bridge.core.checks"]
    assert not _cycle(graph), f"folder cycle {' -> '.join(_cycle(graph))} ({graph})"


# -- no function over radon's cyclomatic complexity 20 (it counts boolean operators) --------------------------------

COMPLEXITY_MAX = 20
# NOTE: each entry is (file, function): its complexity today, which it may not exceed, and the issue that removes
# it; none today
COMPLEXITY_ALLOWED: dict[tuple[str, str], tuple[int, str]] = {}


def _complexities() -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}

    def add(path: str, blocks, prefix: str = "") -> None:
        # NOTE: cc_visit lists functions and methods (a class's block holds its methods again: skipped)
        for b in (b for b in blocks if isinstance(b, radon_visitors.Function)):
            name = prefix + b.fullname
            out[path, name] = max(out.get((path, name), 0), b.complexity)
            add(path, b.closures, name + ".")

    for package in LIBRARY:
        for path in _modules(package).values():
            add(str(path.relative_to(ROOT)), radon_complexity.cc_visit(path.read_text()))
    return out


def test_no_function_over_complexity_20():
    found = _complexities()
    over = {k: c for k, c in found.items() if c > COMPLEXITY_MAX}
    assert ("bridge/core/checks/guards.py", "_order") in found and found[("bridge/tools/localize.py", "localize")] > 5
    grown = [f"{p}: {f} ({c}, allowed {COMPLEXITY_ALLOWED[p, f][0]})" for (p, f), c in over.items()
             if (p, f) in COMPLEXITY_ALLOWED and c > COMPLEXITY_ALLOWED[p, f][0]]
    new = [f"{p}: {f} ({c})" for (p, f), c in over.items() if (p, f) not in COMPLEXITY_ALLOWED]
    stale = [f"{p}: {f}" for (p, f) in COMPLEXITY_ALLOWED if found.get((p, f), 0) <= COMPLEXITY_MAX]
    assert not new, f"functions over complexity {COMPLEXITY_MAX} (split them into named steps): {new}"
    assert not grown, f"allowed functions grew: {grown}"
    assert not stale, f"allowed functions now at most {COMPLEXITY_MAX}: drop them from COMPLEXITY_ALLOWED: {stale}"
