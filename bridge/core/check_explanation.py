"""The function tier's explanation of a failed guard: which check an onnxruntime error stopped at
(:func:`failed_guard`), and its message (:func:`explain_failure`): the eager one where the op's
inputs are known, else the check's text without values.

Example:
    >>> import torch
    >>> from bridge.core.check_vocabulary import Checks, rank
    >>> checks = Checks("d::f", [rank("x", 2)])
    >>> explain_failure(checks, 0, [{"x": torch.ones(3)}], "opbridge_check/d::f/x/0.rank")
    "opbridge: d::f: input 'x' must have 2 dims. Got shape (3,). Pass a 2-D x."
    >>> explain_failure(checks, 0, [], "opbridge_check/d::f/x/0.rank")  # doctest: +NORMALIZE_WHITESPACE
    "opbridge: d::f: input 'x' must have 2 dims. Got a value that fails it inside the model
    (onnxruntime stopped at guard node 'opbridge_check/d::f/x/0.rank'). Pass a 2-D x."
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from bridge.core.check_guards import GUARD_PREFIX, guard_name
from bridge.core.check_vocabulary import Checks

# onnxruntime names a node of an inlined function '_inlfunc_<function>_<node name>' (measured on
# onnxruntime 1.32); only the node's own name is matched, wherever it sits in the message.
# A torchbind method's qualname has a dot: ns::Class.method. The guard node lists its checks
# ('<input>/<index>.<kind>' joined by '+'); onnxruntime's Gather names the index out of bounds
# after the node's name ('idx=<check index + 1>', onnxruntime 1.17 to 1.32).
_GUARD_NAME = re.compile(GUARD_PREFIX + r"/([A-Za-z_][\w]*::[A-Za-z_][\w.]*)/(\w+/\d+\.\w+(?:\+\w+/\d+\.\w+)*)")
_ENTRY = re.compile(r"(\w+)/(\d+)\.\w+")
_CODE = re.compile(r"idx=(\d+)")
_NODE_NAME = re.compile(r"Name:'([^']*)'")


def failed_guard(error: BaseException | str) -> tuple[str, str, int] | None:
    """(op qualname, input, check index) of the check an onnxruntime error stopped at, else None:
    the one onnxruntime's ``idx=`` names, else the guard node's first.

    Example:
        >>> failed_guard("running Gather node. Name:'_inlfunc_f_opbridge_check/d::f/x/3.rank' Status Message: ...")
        ('d::f', 'x', 3)
        >>> failed_guard("Name:'opbridge_check/d::f/x/0.rank+y/2.rank' ... out of data bounds, idx=3 must be ...")
        ('d::f', 'y', 2)
    """
    text = str(error)
    m = _GUARD_NAME.search(text)
    if m is None:
        return None
    entries = [(name, int(index)) for name, index in _ENTRY.findall(m.group(2))]
    code = _CODE.search(text, m.end())
    picked = [e for e in entries if code is not None and e[1] == int(code.group(1)) - 1]
    name, index = (picked or entries)[0]
    return m.group(1), name, index


def guard_node(error: BaseException | str) -> str:
    """The name of the node an onnxruntime error stopped at: the guard node's where the message
    names one (a guard inside an If branch fails as the If node, which names the guard after
    itself), else the first node it names.

    Example:
        >>> guard_node("running If node. Name:'' Status Message: running Gather node. "
        ...            "Name:'_inlfunc_f_opbridge_check/d::f/x/3.rank' Status Message: ...")
        '_inlfunc_f_opbridge_check/d::f/x/3.rank'
    """
    names = _NODE_NAME.findall(str(error))
    return next((n for n in names if GUARD_PREFIX in n), names[0] if names else "")


def explain_failure(checks: Checks, index: int, envs: Sequence[dict], node: str) -> str:
    """The message for guard ``index`` of ``checks`` failing: the eager message when one of
    ``envs`` (the op's inputs at its nodes, where known) fails a check, else the check's text
    without values."""
    for env in envs:
        try:
            message = checks.first_failure(env)
        except Exception:  # noqa: BLE001  an env that cannot be evaluated is skipped
            message = None
        if message is not None:
            return message
    # NOTE: the check's own part of the guard node's name (the node states every check)
    check = checks.checks[index]
    return check.explain(checks.qualname, guard_name(checks.qualname, index, check) if GUARD_PREFIX in node
                         else node)
