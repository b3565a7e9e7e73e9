"""Proxy ops: a torch op of the bridge's own that stands for a call torch cannot keep opaque itself.

Three such calls exist (the third's proxy is defined in ``bridge.core.functions``):

- an op whose only kernel is CompositeImplicitAutograd (C++ libraries registered with the old
  ``torch::RegisterOperators().op(name, &fn)`` API, e.g. torch-scatter): torch.export traces into its
  C++ code and torch refuses ``register_fake`` for it. Its proxy has the same schema (readable
  argument names if asked), carries the user's fake, and its kernel calls the op itself; during
  export, :func:`redirect` sends the model's calls to the proxy, so eager use never changes.
- a method of a torchbind class that no op stands for: its proxy takes the method's tensors and
  the object's flattened state (``__obj_flatten__``) as attributes; its kernel rebuilds the object
  from that state with the class constructor and calls the method.
- a ``torch.autograd.Function``: its proxy's schema is its ONNX node's signature and its kernel the
  Function's forward, a ``torch.library.custom_op`` whose Python kernel derivation traces.

Each is defined by :func:`define_proxy_op`, in the ``opbridge_proxy`` torch namespace; ONNX nodes keep
the original's domain and name.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from bridge.core.basics import torch_compat
from bridge.core.basics.errors import OpBridgeError

PROXY_NAMESPACE = "opbridge_proxy"
_OWN_KERNEL_KEYS = ("Meta", "CPU", "CUDA", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
# NOTE: torch renders the types inside a tuple type the Python way; a proxy schema needs schema syntax.
_STATE_TYPES = {"int": "int", "float": "float", "bool": "bool", "str": "str", "List[int]": "int[]",
                "List[float]": "float[]", "List[bool]": "bool[]"}

# NOTE: torch ops cannot be undefined; a proxy's definition is kept per name. An op's proxy keeps the
# argument names it was first defined with (a registration with other names= is refused: redefining
# it would leave earlier registries' specs naming arguments torch no longer has); a method's and a
# Function's proxy is redefined when its schema changes. The fake and the kernel are looked up here
# at call time, so a later bridge.register of the same op (another registry) swaps them without
# redefining the op: the latest fake= serves every registry holding the op.
_DEFINED: dict[str, tuple[str, Callable[[], None]]] = {}  # proxy name -> (schema, how to undefine it)
_FAKES: dict[str, Callable] = {}
_KERNELS: dict[str, Callable] = {}


def is_composite_only(overload: torch_compat.OpOverload) -> bool:
    """Whether ``overload``'s only kernel is CompositeImplicitAutograd and it has no fake kernel: torch
    traces into it at export (into C++ code, for a C++ library) and refuses a fake for it.

    Example:
        >>> import torch
        >>> is_composite_only(torch.ops.aten.add.Tensor)
        False
    """
    name = overload.name()
    has = torch_compat.has_kernel
    return (has(name, "CompositeImplicitAutograd") and not any(has(name, k) for k in _OWN_KERNEL_KEYS)
            and torch_compat.fake_impl(name) is None)


def proxy_name(*parts: str) -> str:
    """A proxy's name: ``parts`` (``ns::op``, a domain, ...) joined by ``__``, each character a torch op
    name cannot hold as ``_``."""
    return "__".join(re.sub(r"\W", "_", p) for p in parts)


def readable_names(qualname: str, given: Iterable[str], names: Mapping[str, str] | None) -> list[str]:
    """The argument names ``given`` renamed by ``names`` (old -> new); every key must be an argument
    and every resulting name an identifier, distinct from the others.

    Example:
        >>> readable_names("ns::op", ["_0", "_1"], {"_0": "src"})
        ['src', '_1']
    """
    given = list(given)
    names = dict(names or {})
    unknown = sorted(set(names) - set(given))
    if unknown:
        raise OpBridgeError(f"{qualname}: names= renames arguments the op does not have. Got {unknown}. "
                            f"Use keys among {given}.")
    out = [names.get(n, n) for n in given]
    bad = [n for n in out if not isinstance(n, str) or not n.isidentifier() or n.startswith("opbridge")]
    if bad or len(set(out)) != len(out):
        raise OpBridgeError(f"{qualname}: names= must give distinct Python identifiers. Got {out}. "
                            "Pick other names.")
    return out


def define_proxy_op(name: str, schema: str, kernel: Callable, fake: Callable,
                    traced: bool = False) -> torch_compat.OpOverload:
    """Define (or reuse) ``opbridge_proxy::name`` with ``schema``; kernel and fake are swapped in.
    ``traced``: a ``torch.library.custom_op``, whose Python kernel derivation traces (a Function's
    proxy); else the kernel stays opaque to derivation too (it runs C++ code or a torchbind method)."""
    _KERNELS[name], _FAKES[name] = kernel, fake
    old, undefine = _DEFINED.get(name, (None, None))
    if old != schema:
        if undefine is not None:
            undefine()
        qualname, lib = f"{PROXY_NAMESPACE}::{name}", None
        if traced:
            op = torch.library.custom_op(qualname, lambda *args: _KERNELS[name](*args), mutates_args=(),
                                         schema=schema)
            undefine = functools.partial(torch_compat.destroy_custom_op, op)
        else:
            lib = torch.library.Library(PROXY_NAMESPACE, "FRAGMENT")
            lib.define(f"{name}{schema}")
            # NOTE: CompositeExplicitAutograd: the kernel runs for every backend, and export keeps the
            # call one node (it never traces into it).
            lib.impl(name, lambda *args: _KERNELS[name](*args), "CompositeExplicitAutograd")
            undefine = functools.partial(torch_compat.destroy_library, lib)
        torch.library.register_fake(qualname, lambda *args: _FAKES[name](*args), lib=lib)
        _DEFINED[name] = (schema, undefine)
    return getattr(getattr(torch.ops, PROXY_NAMESPACE), name).default


def _top_level(text: str) -> list[str]:
    """``text`` split at commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [p for p in parts + [cur.strip()] if p]


def schema_parts(schema: torch.FunctionSchema) -> tuple[list[tuple[str, str]], list[str]]:
    """``([(type, default text), ...], [return type, ...])`` in schema syntax (``Tensor?``,
    ``SymInt``, ``int[]``), read off torch's own rendering of ``schema``.

    Example:
        >>> import torch
        >>> schema_parts(torch_compat.parse_schema(
        ...     "a::b(Tensor _0, int? _1, int[] l=[1, 2]) -> (Tensor _0, Tensor _1)"))
        ([('Tensor', ''), ('int?', ''), ('int[]', '=[1, 2]')], ['Tensor', 'Tensor'])
    """
    text = str(schema)
    head, _, tail = text.partition(") -> ")
    args = []
    for item in _top_level(head[head.index("(") + 1:]):
        if item == "*":
            continue  # NOTE: keyword-only marker: the proxy takes every argument positionally or by name;
            # its kernel and fake pass the original's keyword-only ones by name (_as_original)
        decl, eq, default = item.partition("=")
        args.append((decl.rsplit(" ", 1)[0].strip(), eq + default))
    tail = tail.strip()
    rets = _top_level(tail[1:-1]) if tail.startswith("(") else [tail]
    return args, [r.split(" ")[0] for r in rets]


def schema_text(pairs: list[tuple[str, str]], names: list[str], returns: list[str]) -> str:
    """A proxy's schema text ``(type name=default, ...) -> returns`` from ``(type, "=default" or "")``
    pairs, argument names and return types, all in schema syntax."""
    rendered = ", ".join(f"{t} {n}{d}" for (t, d), n in zip(pairs, names))
    return f"({rendered}) -> " + (returns[0] if len(returns) == 1 else f"({', '.join(returns)})")


def _as_original(schema: torch.FunctionSchema, fn: Callable) -> Callable:
    """``fn`` called the way ``schema``'s op takes its arguments: the proxy gets every argument
    positionally, the original's keyword-only ones (after ``*``) go by name.

    Example:
        >>> import torch
        >>> call = _as_original(torch_compat.parse_schema("a::b(Tensor x, *, int k=1) -> Tensor"),
        ...                     lambda x, *, k: (x, k))
        >>> call("x", 2)
        ('x', 2)
    """
    keyword = [a.name if a.kwarg_only else None for a in schema.arguments]
    if not any(keyword):
        return fn

    def call(*args):
        positional = [v for v, k in zip(args, keyword) if k is None]
        return fn(*positional, **{k: v for v, k in zip(args, keyword) if k is not None})

    return call


def _renames(original: list[str], renamed: list[str]) -> dict[str, str]:
    """The ``names=`` mapping that turns ``original`` into ``renamed`` (renamed arguments only)."""
    return {a: b for a, b in zip(original, renamed) if a != b}


def define_op_proxy(overload: torch_compat.OpOverload, fake: Callable,
                    names: Mapping[str, str] | None = None) -> torch_compat.OpOverload:
    """The proxy of a composite-only op: same schema (arguments renamed by ``names``), fake ``fake``,
    kernel the op itself. A second call for the same op swaps in its fake (it serves every registry
    holding the op) and must give the same names; other names raise OpBridgeError.

    Example:
        >>> import torch
        >>> lib = torch.library.Library("proxy_doc", "DEF")
        >>> _ = lib.define("twice(Tensor _0, int? _1) -> Tensor")
        >>> lib.impl("twice", lambda x, k: x * 2, "CompositeImplicitAutograd")
        >>> proxy = define_op_proxy(torch.ops.proxy_doc.twice.default, lambda x, k: torch.empty_like(x), {"_0": "x"})
        >>> str(torch_compat.schema_of(proxy)), proxy(torch.ones(1), None).tolist()
        ('opbridge_proxy::proxy_doc__twice(Tensor x, int? _1) -> Tensor', [2.0])
    """
    qualname = overload.name()
    schema = torch_compat.schema_of(overload)
    mutated = [a.name for a in schema.arguments if torch_compat.writes(a)]
    if mutated:
        raise OpBridgeError(f"{qualname}: a composite-only op that writes its arguments cannot be bridged. Got "
                            f"mutated {mutated}. Wrap it in a functional torch.library.custom_op.")
    original = [a.name for a in schema.arguments]
    renamed = readable_names(qualname, original, names)
    pairs, returns = schema_parts(schema)
    text = schema_text(pairs, renamed, returns)
    name = proxy_name(qualname)
    if name in _DEFINED and _DEFINED[name][0] != text:
        had = [a.name for a in
               torch_compat.schema_of(getattr(getattr(torch.ops, PROXY_NAMESPACE), name).default).arguments]
        raise OpBridgeError(f"{qualname} is already bridged through a proxy with names {_renames(original, had)}. "
                            f"Got names {_renames(original, renamed)}. Use the same names= (torch ops cannot be "
                            "undefined, so a proxy keeps its argument names for the whole process), or bridge the "
                            "op in one registry and share it.")
    return define_proxy_op(name, text, _as_original(schema, overload), _as_original(schema, fake))


def _fqn(class_name: str) -> str:
    """'ns::Class' -> '__torch__.torch.classes.ns.Class' (how torch names the class type)."""
    ns, _, cls = class_name.partition("::")
    return f"__torch__.torch.classes.{ns}.{cls}"


def class_schemas(class_name: str) -> dict[str, torch.FunctionSchema]:
    """The method schemas of torchbind class ``ns::Class`` (``self`` first), by method name.

    Example:
        >>> import custom_ops.identity_conv as ic; _ = ic.load_library()  # builds the C++ library once
        >>> sorted(class_schemas("opbridge::IdentityConvClass"))
        ['__getstate__', '__init__', '__obj_flatten__', '__setstate__', 'forward']
    """
    fqn = _fqn(class_name)
    return {s.name: s for s in torch_compat.custom_class_schemas()
            if s.arguments and str(s.arguments[0].type) == fqn}


def _state_types(class_name: str, schemas: dict) -> list[str]:
    """The value types of ``__obj_flatten__``'s ``((name, value), ...)`` pairs, in order."""
    flatten = schemas.get("__obj_flatten__")
    if flatten is None or len(flatten.returns) != 1:
        raise OpBridgeError(f"{class_name} has no __obj_flatten__ method, which gives the object's state as ONNX "
                            "attributes. Got none. Define __obj_flatten__ returning ((name, value), ...) in C++.")
    pairs = flatten.returns[0].type
    try:
        return [_STATE_TYPES[str(p.elements()[1])] for p in pairs.elements()]
    except (AttributeError, IndexError, KeyError):
        raise OpBridgeError(f"{class_name}.__obj_flatten__ must return a tuple of (name, value) pairs. Got {pairs}. "
                            "Return ((name, value), ...) with int, float, bool, str or list values.") from None


def state_types(class_name: str) -> list[str]:
    """The value types of torchbind class ``ns::Class``'s ``__obj_flatten__`` state, in order (a clear error
    where it has no such method).

    Example:
        >>> import custom_ops.identity_conv as ic; _ = ic.load_library()
        >>> state_types("opbridge::IdentityConvClass")
        ['int']
    """
    return _state_types(class_name, class_schemas(class_name))


def method_schema(target: str) -> torch.FunctionSchema:
    """The schema of torchbind method ``"ns::Class.method"`` (``self`` first); a clear error when the
    class or the method does not exist.

    Example:
        >>> import custom_ops.identity_conv as ic; _ = ic.load_library()
        >>> str(method_schema("opbridge::IdentityConvClass.forward"))
        'forward(__torch__.torch.classes.opbridge.IdentityConvClass _0, Tensor _1) -> Tensor _0'
    """
    class_name, _, method = target.rpartition(".")
    schemas = class_schemas(class_name)
    if not schemas:
        raise OpBridgeError(f"torch has no torchbind class {class_name!r}. Got {target!r}. Load the library that "
                            "defines it first (torch.ops.load_library(path)).")
    if method not in schemas or method.startswith("__"):
        public = sorted(m for m in schemas if not m.startswith("__"))
        raise OpBridgeError(f"{class_name} has no method {method!r}. Got {target!r}. Use one of {public}.")
    return schemas[method]


def define_method_proxy(target: str, attributes: list[str], fake: Callable,
                        names: Mapping[str, str] | None = None) -> torch_compat.OpOverload:
    """The proxy of torchbind method ``"ns::Class.method"``: the method's arguments (renamed by
    ``names``), then the object's state as ``attributes`` (names of ``__obj_flatten__``'s pairs, in
    order; types from its schema); fake ``fake``; kernel the method of an object built by the class
    constructor from the state (cached per state).

    Example:
        >>> import torch, custom_ops.identity_conv as ic; _ = ic.load_library()
        >>> proxy = define_method_proxy("opbridge::IdentityConvClass.forward", ["channels"],
        ...                             lambda x, channels: torch.empty_like(x), {"_1": "x"})
        >>> str(torch_compat.schema_of(proxy)), proxy(torch.ones(1, 2), 2).shape
        ('opbridge_proxy::opbridge__IdentityConvClass__forward(Tensor x, int channels) -> Tensor', torch.Size([1, 2]))
    """
    class_name, _, method = target.rpartition(".")
    schemas = class_schemas(class_name)
    schema = method_schema(target)
    args = schema.arguments[1:]
    pairs, returns = schema_parts(schema)
    bad = [f"{a.name}: {t}" for a, (t, _) in zip(args, pairs[1:]) if t not in ("Tensor", "Tensor?")]
    if bad:
        raise OpBridgeError(f"{target}: only tensor arguments can be bridged for a method (state becomes "
                            f"attributes). Got {bad}. Move the other values into the object's state.")
    types = _state_types(class_name, schemas)
    if len(attributes) != len(types):
        raise OpBridgeError(f"{target}: attributes= must name each of the {len(types)} values of "
                            f"{class_name}.__obj_flatten__ ({types}), in order. Got {list(attributes)}. "
                            "Pass attributes=[...] with the names __obj_flatten__ gives.")
    renamed = readable_names(target, [a.name for a in args], names)
    text = schema_text(pairs[1:] + [(t, "") for t in types], renamed + list(attributes), returns)
    init = schemas.get("__init__")
    init_types = [_STATE_TYPES.get(str(a.type)) for a in init.arguments[1:]] if init is not None else None
    ns, _, cls = class_name.partition("::")
    objects: dict[tuple, Any] = {}
    n_tensors = len(args)

    def kernel(*values):
        state = tuple(values[n_tensors:])
        if init_types != types:
            raise OpBridgeError(f"{target}: the object cannot be rebuilt from its state: the constructor takes "
                                f"{init_types}, __obj_flatten__ gives {types}. Got state {state}. Give the class "
                                "a constructor taking the flattened values in order, or use the function tier.")
        if state not in objects:
            objects[state] = getattr(getattr(torch.classes, ns), cls)(*state)
        return getattr(objects[state], method)(*values[:n_tensors])

    return define_proxy_op(proxy_name(class_name, method), text, kernel, fake)


def user_fake_class(class_name: str) -> Any | None:
    """The fake class registered for torchbind class ``class_name`` by someone else than the bridge.

    Example:
        >>> import custom_ops.identity_conv as ic; _ = ic.load_library()
        >>> user_fake_class("opbridge::IdentityConvClass").__name__
        'FakeIdentityConvClass'
    """
    cls = torch_compat.find_fake_class(_fqn(class_name))
    return None if cls is None or getattr(cls, "_opbridge_proxy", False) else cls


def ensure_fake_class(class_name: str, method: str, proxy: torch_compat.OpOverload, attributes: list[str]) -> None:
    """Register a fake class for ``class_name`` whose ``method`` runs the proxy on fake tensors, unless
    the user registered one: export needs it to trace a model holding the object. The bridge's own
    is replaced on a later registration (new state names).

    Example:
        >>> import torch, custom_ops.identity_conv as ic; _ = ic.load_library()
        >>> proxy = define_method_proxy("opbridge::IdentityConvClass.forward", ["channels"],
        ...                             lambda x, channels: torch.empty_like(x))
        >>> ensure_fake_class("opbridge::IdentityConvClass", "forward", proxy, ["channels"])
        >>> user_fake_class("opbridge::IdentityConvClass").__name__  # the user's own is kept
        'FakeIdentityConvClass'
    """
    if user_fake_class(class_name) is not None:
        return
    if torch_compat.has_fake_class(_fqn(class_name)):
        torch_compat.deregister_fake_class(class_name)

    class FakeObject:
        _opbridge_proxy = True

        def __init__(self, state: dict):
            self.state = state

        @classmethod
        def __obj_unflatten__(cls, flat):
            return cls(dict(flat))

    def call(self, *tensors):
        return proxy(*tensors, *(self.state[a] for a in attributes))

    setattr(FakeObject, method, call)
    FakeObject.__name__ = f"Fake{class_name.partition('::')[2]}"
    torch_compat.register_fake_class(class_name, FakeObject)


def specialisation_check(qualname: str, proxy: torch_compat.OpOverload) -> Callable:
    """``check(args, kwargs)`` raising OpBridgeError when an ``int`` (not ``SymInt``) argument of
    ``proxy`` gets a symbolic size: torch would specialise it, and the export would fail with a
    constraint error that names no op.

    Example:
        >>> import torch
        >>> check = specialisation_check("vendor::op", torch.ops.aten.select.int)
        >>> check((torch.ones(3), 0, 1), {}) is None  # plain ints pass
        True
    """
    schema = torch_compat.schema_of(proxy)
    pairs, names = schema_parts(schema)[0], [a.name for a in schema.arguments]
    ints = {i for i, (t, _) in enumerate(pairs) if t.startswith("int")}  # NOTE: int, int?, int[], int[2]

    def check(args, kwargs):
        for i, name in enumerate(names):
            value = args[i] if i < len(args) else kwargs.get(name)
            values = value if isinstance(value, (list, tuple)) else [value]
            if i in ints and any(isinstance(v, torch.SymInt) and not v.node.is_constant() for v in values):
                raise OpBridgeError(
                    f"{qualname}: argument '{name}' is declared int, but the model passes a size that was "
                    f"marked dynamic, which torch would specialise to the example's value. Got {name}={value}. "
                    f"Declare '{name}' SymInt in the op's schema, or pass a fixed size (a Python constant, "
                    "with that dim static in dynamic_shapes).")

    return check


class _Redirect(TorchFunctionMode):
    def __init__(self, targets: dict):
        super().__init__()
        self.targets = targets

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        hit = self.targets.get(func)
        if hit is None:
            return func(*args, **kwargs)
        original, proxy, check = hit
        if kwargs and proxy is not original:  # NOTE: keywords of the original's names, the proxy's own
            renamed = dict(zip((a.name for a in torch_compat.schema_of(original).arguments),
                               (a.name for a in torch_compat.schema_of(proxy).arguments)))
            kwargs = {renamed.get(k, k): v for k, v in kwargs.items()}
        check(args, kwargs)
        return proxy(*args, **kwargs)


@contextlib.contextmanager
def redirect(targets: Mapping[torch_compat.OpOverload, tuple[torch_compat.OpOverload, Callable]]):
    """While active, calls of each original op (overload or packet) go to its proxy after
    ``check(args, kwargs)`` (keywords renamed to the proxy's argument names); the export traces the
    proxy as one node. Nothing changes outside.

    Example:
        >>> import torch
        >>> with redirect({torch.ops.aten.sin.default: (torch.ops.aten.cos.default, lambda a, k: None)}):
        ...     torch.ops.aten.sin.default(torch.zeros(1)).tolist()
        [1.0]
    """
    table = {}
    for original, (proxy, check) in targets.items():
        table[original] = (original, proxy, check)
        # NOTE: a packet call (torch.ops.ns.op(...)) reaches the mode as the packet; it is the
        # bridged overload only when the op has no other.
        if len(original.overloadpacket.overloads()) == 1:
            table[original.overloadpacket] = (original, proxy, check)
    if not table:
        yield
        return
    with _Redirect(table):
        yield
