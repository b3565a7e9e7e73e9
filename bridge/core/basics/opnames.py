"""An op's names across tiers, all derived from its ONNX full name ``domain::op_type`` here, once.

The native tier finds an op's seed kernel file and links its entry symbol by these names, so two
ops meet in one library only through their full names: ``mine::identity_conv`` never gets the
kernel of ``opbridge::identity_conv``, and ``a::scale`` and ``b::scale`` each get their own symbol.

Example:
    >>> n = op_names("opbridge::identity_conv")
    >>> n.domain, n.op_type, n.source_file, n.symbol
    ('opbridge', 'identity_conv', 'cpu/opbridge_op_identity_conv.cc', 'kernel_opbridge_op_identity_conv')
    >>> op_names("com.example::scale").symbol, op_names("com_example::scale").symbol
    ('kernel_com_dexample_op_scale', 'kernel_com_uexample_op_scale')
"""

from __future__ import annotations

import dataclasses
import re

from bridge.core.basics.errors import OpBridgeError

_OP_TYPE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# NOTE: a domain is mangled into [A-Za-z0-9_]: letters and digits stay, every other character
# becomes "_" plus a letter (u d h) or "_x" plus two hex digits per UTF-8 byte. No escape starts
# with "_o", so the first "_op_" always ends the domain: the mapping is one-to-one. ("__" is avoided:
# C++ reserves identifiers that contain it.)
_ESCAPES = {"_": "_u", ".": "_d", "-": "_h"}
SEPARATOR = "_op_"
SOURCE_FOLDER = "cpu"  # seed kernels, relative to the ort_kernels package


def _mangle(domain: str) -> str:
    out = []
    for ch in domain:
        if ch.isascii() and ch.isalnum():
            out.append(ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        else:
            out.extend(f"_x{b:02x}" for b in ch.encode())
    return "".join(out)


def c_string(text: str) -> str:
    """``text`` as a C string literal (quotes, backslashes and non-printable bytes escaped).

    >>> print(c_string('a"b.c'))
    "a\\"b.c"
    """
    out = []
    for b in text.encode():
        ch = chr(b)
        out.append("\\" + ch if ch in '"\\' else ch if 32 <= b < 127 else f"\\{b:03o}")
    return '"' + "".join(out) + '"'


@dataclasses.dataclass(frozen=True)
class OpNames:
    """Every name of one op: ONNX domain and op type, seed kernel file, C++ entry symbol, table entry."""

    domain: str
    op_type: str

    @property
    def qualname(self) -> str:
        return f"{self.domain}::{self.op_type}"

    @property
    def stem(self) -> str:
        """The mangled full name: the seed kernel's file stem and the symbol's suffix."""
        return _mangle(self.domain) + SEPARATOR + self.op_type

    @property
    def source_file(self) -> str:
        """The seed kernel's C++ file, relative to the ``ort_kernels`` package."""
        return f"{SOURCE_FOLDER}/{self.stem}.cc"

    @property
    def symbol(self) -> str:
        """The kernel's entry, ``extern const KernelDef <symbol>`` in namespace opbridge."""
        return f"kernel_{self.stem}"

    @property
    def declaration(self) -> str:
        return f"extern const KernelDef {self.symbol};"

    @property
    def definition(self) -> str:
        """What the kernel file defines (shown in messages and docs)."""
        return f"extern const KernelDef {self.symbol} = make_kernel<...>();"

    def table_entry(self, version: int, input_types, optional_mask: int, output_types) -> str:
        """One row of the generated op table (``OpEntry`` in opbridge_registry.h).

        >>> op_names("a.b::f").table_entry(1, (1, 7), 2, (1,))
        '{"a.b", 1, "f", &kernel_a_db_op_f, 2, {1, 7}, 2u, 1, {1}},'
        """
        ins, outs = ", ".join(map(str, input_types)), ", ".join(map(str, output_types))
        return (f"{{{c_string(self.domain)}, {version}, {c_string(self.op_type)}, &{self.symbol}, "
                f"{len(input_types)}, {{{ins}}}, {optional_mask}u, {len(output_types)}, {{{outs}}}}},")


def op_names(qualname: str) -> OpNames:
    """The names of the op whose ONNX full name is ``domain::op_type`` (the domain may hold dots).

    >>> op_names("bev::bev_pool_v2").source_file
    'cpu/bev_op_bev_pool_v2.cc'
    """
    domain, sep, op_type = qualname.rpartition("::") if isinstance(qualname, str) else ("", "", "")
    if not sep or not _OP_TYPE.match(op_type):
        raise OpBridgeError(f"an op's full name must be 'domain::op_type' with an identifier op type. "
                            f"Got {qualname!r}. Use e.g. 'bev::bev_pool_v2'.")
    return OpNames(domain, op_type)


def spec_names(spec) -> OpNames:
    """The names of a registered op (an ``OpSpec``): its ONNX domain and op type decide them."""
    return op_names(f"{spec.domain}::{spec.name}")
