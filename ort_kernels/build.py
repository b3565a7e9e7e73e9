"""Build the native ONNX Runtime custom-op library on first use, cached (``bridge.core.cppbuild``) by
sources, generated table, ORT version, flags and compiler.

The op table compiled into the library (domain, name, version, input/output element types per
dtype) is generated from the registry, so no op name or domain is typed twice.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import weakref
from pathlib import Path

import onnxruntime
import torch

from bridge.core import cppbuild
from bridge.core.basics.dtypes import TORCH_TO_ONNX
from bridge.core.basics.errors import BuildError, OpBridgeError
from bridge.core.basics.opnames import op_names, spec_names
from bridge.core.basics.progress import step
from bridge.core.basics.torch_compat import fake_mode
from bridge.core.registry import REGISTRY
from bridge.core.spec import OpSpec

SOURCE_DIR = Path(__file__).resolve().parent
INCLUDE_DIR = SOURCE_DIR / "include"
COMMON_SOURCES = ("cpu/common.cc", "register.cc")
LIBRARY_NAME = "libopbridge_ort.so"
# NOTE: the one env var that switches the build to the official ONNX Runtime C headers.
ORT_INCLUDE_ENV = "OPBRIDGE_ORT_INCLUDE_DIR"
CXXFLAGS_ENV = "OPBRIDGE_CXXFLAGS"  # extra compiler flags, appended to the build's own
# NOTE: -ffp-contract=off: no multiply and add is fused, so every ISA path of a kernel (baseline,
# AVX2, AVX-512, NEON) rounds each step the same way and gives bitwise the same result on every CPU.
CODEGEN_FLAGS = ("-std=c++17", "-O3", "-ffp-contract=off", "-fPIC", "-pthread", "-fvisibility=hidden", "-Wall",
                 "-Wextra")
CACHE_KIND = "native"
NO_COMPILER_FIX = (", or use a library built elsewhere (`opbridge build -o DIR`, then native_library= or "
                   "$OPBRIDGE_NATIVE_LIBRARY)")
MAX_INPUTS, MAX_OUTPUTS = 16, 8  # sizes of the type arrays in the generated table
_MISSING_SYMBOL = re.compile(r"undefined reference to `opbridge::(kernel_\w+)'")  # a link error's kernel entry
# NOTE: gcc's and clang's words for an option they do not know
_REFUSED_FLAG = re.compile(r"(unrecognized command[- ]line option|unknown argument|unrecognized option)[^\n]*")


@dataclasses.dataclass(frozen=True)
class NativeEntry:
    """One typed kernel registration: an op at one dtype."""

    spec: OpSpec
    dtype: torch.dtype
    input_types: tuple[int, ...]
    output_types: tuple[int, ...]


def native_source(spec) -> Path | None:
    """The op's C++ kernel file: the spec's ``native=``, else the seed kernel its full ONNX name
    derives (``ort_kernels/cpu/<domain>_op_<op type>.cc``, ``bridge.core.basics.opnames``), if it exists."""
    if getattr(spec, "native_source", None):
        return Path(spec.native_source)
    path = SOURCE_DIR / spec_names(spec).source_file
    return path if path.is_file() else None


def io_types(spec, dtype: torch.dtype) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """ONNX element types of ``spec``'s inputs and outputs at ``dtype``, from its samples through its
    fake kernel."""
    # NOTE: the torch schema says "Tensor", the samples say which tensors are int32. An optional input
    # omitted in the first sample takes its type from a sample that gives it (else the sample dtype).
    samples = spec.sample_inputs(dtype) if spec.sample_inputs else []
    if not samples:
        raise OpBridgeError(f"{spec.qualname}: a native kernel needs sample inputs to derive its types. "
                            f"Got none for {dtype}. Pass sample_inputs= to @bridge.op.")
    bound = [spec.bind(*s.args, **s.kwargs) for s in samples]
    inputs = tuple(next((TORCH_TO_ONNX[b[p.name].dtype] for b in bound if isinstance(b[p.name], torch.Tensor)),
                        TORCH_TO_ONNX[dtype]) for p in spec.tensors)
    # NOTE: a shape environment (inputs kept static) lets a fake kernel give an output a data-dependent
    # size (torch.library.get_ctx().new_dynamic_size(), as nms does): only the element types are read here,
    # and the kernel allocates its output at run time, after computing the count.
    with fake_mode(shape_env=True) as mode:
        fake_args = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in bound[0].items()}
        out = spec.overload(**fake_args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return inputs, tuple(TORCH_TO_ONNX[o.dtype] for o in outs)


def native_entries(registry) -> list[NativeEntry]:
    """Every (op, dtype) the native library serves, derived from the registry."""
    entries = []
    for spec in registry.exportable():
        if native_source(spec) is None:
            continue
        for dtype in spec.dtypes:
            inputs, outputs = io_types(spec, dtype)
            if len(inputs) > MAX_INPUTS or len(outputs) > MAX_OUTPUTS:
                raise OpBridgeError(f"{spec.qualname}: native kernels take at most {MAX_INPUTS} inputs and "
                                    f"{MAX_OUTPUTS} outputs. Got {len(inputs)}/{len(outputs)}. Split the op.")
            entries.append(NativeEntry(spec, dtype, inputs, outputs))
    return entries


# NOTE: keyed by the registry itself, weakly: a new registry can take a dead one's id() (and have its
# generation), so an id() key would give it the dead one's ops; entries go with their registry
_entries_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # registry -> (generation, entries)


def cached_entries(registry) -> list[NativeEntry]:
    """``native_entries`` once per registry content: sessions ask on every creation."""
    cached = _entries_cache.get(registry)
    if cached is None or cached[0] != registry.generation:
        cached = _entries_cache[registry] = (registry.generation, native_entries(registry))
    return cached[1]


def served_ops(registry) -> dict[tuple[str, str], tuple[torch.dtype, ...]]:
    """(domain, op_type) -> dtypes the native library serves."""
    served: dict = {}
    for e in cached_entries(registry):
        served.setdefault((e.spec.domain, e.spec.name), []).append(e.dtype)
    return {k: tuple(v) for k, v in served.items()}


def optional_mask(spec) -> int:
    """Bit i set when the op's i-th tensor input is optional (``Tensor?``)."""
    return sum(1 << i for i, p in enumerate(spec.tensors) if p.optional)


def generate_table(entries: list[NativeEntry]) -> str:
    """C++ source of the op table compiled into the library (names from ``bridge.core.basics.opnames``)."""
    names = {e.spec.qualname: spec_names(e.spec) for e in entries}
    lines = ["// Generated by ort_kernels/build.py from the opbridge registry. Do not edit.",
             '#include "opbridge_registry.h"', "", "namespace opbridge {"]
    lines += sorted({n.declaration for n in names.values()})
    lines += ["", "const OpEntry kOpTable[] = {"]
    lines += ["    " + names[e.spec.qualname].table_entry(e.spec.version, e.input_types, optional_mask(e.spec),
                                                          e.output_types) for e in entries]
    lines += ["};", f"const size_t kOpTableSize = {len(entries)};", "", "}  // namespace opbridge", ""]
    return "\n".join(lines)


def _official_include() -> Path | None:
    value = os.environ.get(ORT_INCLUDE_ENV)
    if not value:
        return None
    path = Path(value)
    if not (path / "onnxruntime_c_api.h").is_file():
        raise OpBridgeError(f"{ORT_INCLUDE_ENV} must point at a folder holding onnxruntime_c_api.h. Got {value!r}. "
                            f"Fix the path or unset {ORT_INCLUDE_ENV} to use opbridge's own ABI declaration.")
    return path


def _sources(entries) -> list[Path]:
    op_sources = sorted({path for e in entries if (path := native_source(e.spec)) is not None})  # all have one
    return [SOURCE_DIR / s for s in COMMON_SOURCES] + op_sources


def cache_dir() -> Path:
    """Where built libraries live: ``native/`` under the one cache root (``bridge.core.cppbuild``)."""
    return cppbuild.cache_folder(CACHE_KIND)


def source_key(entries) -> str:
    """Hash of everything the binary depends on but the compiler: sources, table, ORT version,
    headers, the build's own flags, ``$OPBRIDGE_CXXFLAGS``."""
    h = hashlib.sha256()
    include = _official_include()
    for path in sorted(INCLUDE_DIR.glob("*.h")) + _sources(entries) + (
            [include / "onnxruntime_c_api.h"] if include else []):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(generate_table(entries).encode())
    h.update(onnxruntime.__version__.encode())
    h.update(b"\0" + " ".join(CODEGEN_FLAGS).encode())
    h.update(b"\0" + os.environ.get(CXXFLAGS_ENV, "").encode())
    return h.hexdigest()[:16]


def build_key(entries) -> str:
    """The cache folder's name: :func:`source_key` joined with the compiler's identity (``$CXX`` and
    its version line). A machine without a compiler loads a library built earlier from the same
    sources and flags, by whichever compiler (``build.txt`` beside it records which)."""
    return cppbuild.full_key(source_key(entries))


def library_path(registry=None, *, build: bool = True) -> Path:
    """Path of the native library for ``registry`` (default: the global one), building it if asked.
    Every op's kernel must build (a deployable library holds them all); sessions use
    :func:`native_library`, which leaves out an op whose kernel does not build.

    A cached library is used only when it verifies (``bridge.core.cppbuild.verified``); a truncated,
    empty or planted file is replaced by a fresh build.

    Example:
        >>> import bridge, custom_ops
        >>> library_path(build=True).name
        'libopbridge_ort.so'
    """
    entries = cached_entries(REGISTRY if registry is None else registry)
    if not build:
        return cppbuild.cached_path(CACHE_KIND, source_key(entries), LIBRARY_NAME)
    return _build(entries)


def _build(entries) -> Path:
    return cppbuild.cached_build(CACHE_KIND, source_key(entries), LIBRARY_NAME, functools.partial(_compile, entries),
                                 purpose="the native kernel library", fix=NO_COMPILER_FIX)


@dataclasses.dataclass(frozen=True)
class NativeLibrary:
    """A native library for sessions: ``path``, and ``broken``: (domain, name) of each op left out
    because its own C++ kernel does not build -> the error a session that uses it raises."""

    path: Path
    broken: dict[tuple[str, str], BuildError]


_partial: dict[str, NativeLibrary] = {}  # source key of every op's library -> one without its broken kernels


def native_library(registry=None) -> NativeLibrary:
    """The native library for sessions of ``registry``: every op's kernel when all build; else, when
    some op's own C++ file does not build, a library without those ops, each named in ``broken``, so
    only the sessions that use one fail (a build failure of another cause, or of the shared sources,
    is raised as it is)."""
    entries = cached_entries(REGISTRY if registry is None else registry)
    key = source_key(entries)
    if key in _partial and cppbuild.verified(_partial[key].path):
        return _partial[key]
    try:
        return NativeLibrary(_build(entries), {})
    except BuildError as e:
        if e.cause != "source":
            raise
        broken = _broken_kernels(entries, e)
        kept = [x for x in entries if (x.spec.domain, x.spec.name) not in broken]
        if not broken or not kept:
            raise
    _partial[key] = NativeLibrary(_build(kept), broken)
    return _partial[key]


def _broken_kernels(entries, failure: BuildError) -> dict[tuple[str, str], BuildError]:
    """The ops whose own C++ file is what failed the build: the compiler's errors name it (else, when
    they name none, it does not compile alone), or it lacks its entry symbol (named in the link
    error); each with its own error."""
    by_source: dict[Path, list[OpSpec]] = {}
    for e in entries:
        path = native_source(e.spec)
        if path is not None and e.spec not in by_source.setdefault(path, []):
            by_source[path].append(e.spec)
    errors = {path: lines for path in by_source if (lines := _said_about(path, failure.detail))}
    if not errors:
        cxx = cppbuild.compiler("the native kernel library", NO_COMPILER_FIX)
        for path in by_source:
            result = cppbuild.run_compiler([cxx, *_flags(), "-fsyntax-only", str(path), *_extra_flags()],
                                           "the native kernel library")
            if result.returncode != 0:
                errors[path] = result.stderr.splitlines()
    missing = set(_MISSING_SYMBOL.findall(failure.detail))
    broken: dict[tuple[str, str], BuildError] = {}
    for path, specs in by_source.items():
        for spec in specs:
            if path in errors:
                said = "\n".join(errors[path])[-3000:]
                why = f"does not compile. Got:\n{said}\nFix that file"
            elif spec_names(spec).symbol in missing:
                why = f"does not define `{spec_names(spec).definition}` in namespace opbridge. Got no such symbol. " \
                      "Define it as bridge.core.basics.opnames derives the name"
            else:
                continue
            broken[(spec.domain, spec.name)] = BuildError(
                f"{spec.qualname}: its C++ kernel {str(path)!r} {why} (sessions whose models do not use "
                f"{spec.qualname} run without it).", "source", failure.detail)
    return broken


def _said_about(path: Path, output: str) -> list[str]:
    """The compiler's lines about ``path``: each diagnostic naming it and the source lines it quotes."""
    said: list[str] = []
    quoting = False
    for line in output.splitlines():
        quoting = line.startswith(f"{path}:") or (quoting and line.startswith(" "))
        if quoting:
            said.append(line)
    return said


def _flags() -> list[str]:
    """The compiler flags every source of the library is built with (headers, warnings, optimisation)."""
    include = _official_include()
    official = ["-DOPBRIDGE_OFFICIAL_ORT_HEADERS", f"-I{include}"] if include is not None else []
    return [*official, *CODEGEN_FLAGS, f"-I{INCLUDE_DIR}"]


def _extra_flags() -> list[str]:
    """``$OPBRIDGE_CXXFLAGS``: last on the command line (after the sources: libraries to link too)."""
    return os.environ.get(CXXFLAGS_ENV, "").split()


def _compile(entries, tmp: Path, cxx: str) -> Path:
    table = tmp / "op_table.cc"
    table.write_text(generate_table(entries))
    out = tmp / LIBRARY_NAME
    # NOTE: --no-undefined: a kernel entry missing from its .cc fails here, naming the symbol,
    # not later inside onnxruntime's dlopen
    cmd = [cxx, *_flags(), "-shared", "-Wl,--no-undefined", *map(str, _sources(entries)), str(table), "-o", str(out),
           *_extra_flags()]
    with step(f"building native kernels ({len(entries)} typed kernels)"):
        result = cppbuild.run_compiler(cmd, "the native kernel library")
    if result.returncode != 0:
        raise _build_error(entries, result)
    (tmp / "build.txt").write_text(" ".join(cmd) + "\n" + cppbuild.toolchain(cxx) + "\n")
    return out


def _build_error(entries, result) -> BuildError:
    """The build failure, by its cause (``bridge.core.cppbuild.build_failure``), with a missing kernel
    entry named plainly."""
    refused = _REFUSED_FLAG.search(result.stderr) if _extra_flags() else None
    if refused is not None:  # NOTE: a flag the user added, not the C++ source
        return BuildError(f"building the native kernel library failed: the compiler refused a flag of ${CXXFLAGS_ENV} "
                          f"({' '.join(_extra_flags())!r}). Got {refused.group(0).strip()!r}. Fix or unset "
                          f"{CXXFLAGS_ENV}.", "flags", result.stderr)
    missing = sorted(set(_MISSING_SYMBOL.findall(result.stderr)))
    if missing:
        by_symbol = {spec_names(e.spec).symbol: e.spec for e in entries}
        lines = [f"{native_source(by_symbol[s])} must define `{spec_names(by_symbol[s]).definition}` in "
                 f"namespace opbridge (op {spec_names(by_symbol[s]).qualname})" for s in missing if s in by_symbol]
        return BuildError(f"the native kernel build found no entry symbol for {', '.join(missing)}. Got: "
                          + "; ".join(lines) + ". Name the entry kernel_<mangled domain>_op_<op type> as "
                          "bridge.core.basics.opnames derives it (see ort_kernels/include/opbridge_kernel.h and "
                          f"ort_kernels/{op_names('opbridge::identity_conv').source_file}).", "source", result.stderr)
    return cppbuild.build_failure("the native kernel library", result.stderr, exit_code=result.returncode)
