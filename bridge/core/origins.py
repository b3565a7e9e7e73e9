"""What a registered op stands for in the user's code: one typed origin per form of op.

An ``OpSpec``'s ``origin`` says which form the op was given in and answers, for that form, the questions the
other floors ask: which torch op's calls export records as the op's node (:meth:`Origin.recorded`), whether the
op export records is a proxy standing for another (:attr:`Origin.proxied`), the ``torch.autograd.Function`` whose
calls are its nodes (:attr:`Origin.function`), whether that Function has its own backward, and the op's one-line
description. Nothing else decodes the form.

>>> Declared().recorded(torch.ops.aten.relu.default) is torch.ops.aten.relu.default
True
>>> TorchbindMethod("my_ops::Conv.forward").describe("my_ops::Conv.forward")
'my_ops::Conv.forward (torchbind method, bridged)'
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch  # noqa: F401  (the doctest's namespace)

if TYPE_CHECKING:
    from bridge.core.functions import FunctionBridge
    from bridge.core.registered import RegisteredSymbolic


def class_name(cls: type) -> str:
    """A class's dotted name, as error messages and descriptions name a Function."""
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclasses.dataclass(frozen=True)
class Origin:
    """An op declared with ``@bridge.op``: the op export records is the op itself."""

    proxied = False  # the op export records (``OpSpec.custom_op``) is a proxy standing for another
    # the node's attribute types are known from a call or a file, not from registration (a Function's
    # ``int`` argument may be called with a tuple): its ONNX schema waits for that use (``Registry.settle``)
    typed_by_use = False

    def recorded(self, overload: Any) -> Any | None:
        """The torch op whose calls torch.export records as this op's node (``overload``: the op's own), or None
        where calls reach the node another way (a torchbind method's redirect, a Function's export forward)."""
        return overload

    @property
    def function(self) -> FunctionBridge | None:
        """The Function whose calls are this op's nodes, as its node is described."""
        return None

    @property
    def has_backward(self) -> bool | None:
        """Does the form define the op's gradient itself (a Function's ``backward``)? None: ask torch."""
        return None

    def describe(self, qualname: str) -> str | None:
        """The op's one-line description, or None where the user's docstring is it."""
        return None


class Declared(Origin):
    """An op declared with ``@bridge.op`` (a ``torch.library.custom_op`` of the bridge's own)."""


@dataclasses.dataclass(frozen=True)
class Existing(Origin):
    """An op defined elsewhere (``TORCH_LIBRARY``, ``torch.library.custom_op``) registered as it is: export
    records its own calls."""

    def describe(self, qualname: str) -> str:
        return f"{qualname} (existing op, bridged)"


@dataclasses.dataclass(frozen=True)
class Proxied(Existing):
    """An op defined elsewhere recorded through a proxy op (``bridge.core.proxy``): a composite-only C++ op,
    which torch.export would trace into, or one ``names=`` renames; export sends calls of ``op`` to the proxy."""

    op: Any = None  # the OpOverload the proxy stands for
    proxied = True

    def recorded(self, overload: Any) -> Any:
        return self.op


@dataclasses.dataclass(frozen=True)
class TorchbindMethod(Origin):
    """A method of a torchbind class (``"ns::Class.method"``): its calls reach the proxy through the class's
    fake, its object's state becomes the node's attributes."""

    target: str = ""
    proxied = True

    def recorded(self, overload: Any) -> None:
        return None

    def describe(self, qualname: str) -> str:
        return f"{qualname} (torchbind method, bridged)"


@dataclasses.dataclass(frozen=True)
class FunctionClass(Origin):
    """A ``torch.autograd.Function`` subclass: each ``apply`` is one node, as its ``symbolic`` writes it."""

    bridge: FunctionBridge | None = None
    proxied = True
    typed_by_use = True

    def recorded(self, overload: Any) -> None:
        return None

    @property
    def function(self) -> FunctionBridge | None:
        return self.bridge

    @property
    def has_backward(self) -> bool:
        assert self.bridge is not None
        return self.bridge.has_backward

    def describe(self, qualname: str) -> str:
        assert self.bridge is not None
        return f"{class_name(self.bridge.cls)} (torch.autograd.Function, bridged)"


@dataclasses.dataclass(frozen=True)
class RegisteredSymbolicOp(FunctionClass):
    """An op with a symbolic registered with ``torch.onnx.register_custom_op_symbolic``, bridged as the
    Function standing for one call of it (``bridge.core.registered``)."""

    symbolic: RegisteredSymbolic | None = None

    def describe(self, qualname: str) -> str:
        assert self.symbolic is not None
        return (f"{self.symbolic.qualname} (its symbolic {self.symbolic.symbolic_name}, registered with torch.onnx, "
                "bridged)")
