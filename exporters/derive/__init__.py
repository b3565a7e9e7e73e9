"""Derived ONNX function bodies: an op with no written ``function=`` body gets one traced from its own
PyTorch implementation, so ops written in plain torch need no ONNX code.

At each export site (a custom node of a model) the op's implementation — a ``torch.library.custom_op``'s
Python function, or the composite (CompositeImplicitAutograd) kernel of an op defined elsewhere — is
traced with ``torch.export`` at the site's input dtypes and ranks, every tensor dim and every int
attribute dynamic, exported with ``torch.onnx`` at the model's opset, and turned into a FunctionProto
in the op's domain with the op's input and attribute names:

- int / int[] attributes the trace keeps symbolic become FunctionProto attributes
  (``Constant <value_int: int = @k>``); float, bool and str attributes, and ints the implementation
  branches on, are baked in. A body is derived (and verified) per exact site: input dtypes and dims,
  attribute values; sites whose bodies are the same bytes share one function, the others get one
  each (ONNX function ``overload``).
- ScatterND with a reduction (what ``index_put(accumulate=True)`` and ``index_add`` become), which
  onnxruntime's threaded CPU kernel runs nondeterministically over duplicate indices, is rewritten to
  ScatterElements over the flattened data, which accumulates in a fixed order.
- before use, every body passes ``onnx.checker`` (full) and runs in onnxruntime against eager at the
  traced sizes and, where the site has dynamic dims, at other sizes, each dim at 0 and 1 too (in a
  child process: a size onnxruntime dies at is named in the body's doc_string, and sessions refuse
  it, for nodes in If/Loop bodies too; an inlined model carries it in its ``opbridge.crashes`` metadata
  entry, ``crash_sites``); an implementation returning (a view of) an input, which torch forbids for custom ops, is an
  OpBridgeError naming the op.

An op torch.onnx already translates (onnxscript's torch_lib, e.g. torchvision's ``nms``, ``roi_align``,
``deform_conv2d``) and given no body is traced as itself, kept opaque, and exported with that
translation: every attribute baked in (a translation reads them as Python values), the body checked
and loaded in onnxruntime but not compared with eager on random values (no valid boxes or indices).

An implementation that cannot be traced (NumPy, ``.item()``, data-dependent control flow, a C++
kernel) gives no body; its kind (``exporters.kinds.DerivedBody.status``) says why in one line and the
other tiers still run the op.

Modules, bottom up: ``sites`` (what a body is derived for, the errors), ``implementation`` (the
code traced), ``cache`` (every cache, one object tied to the registry's generation), ``tracing``
(the op alone under torch.export and torch.onnx), ``contained`` (onnxruntime in a child process),
``scatter`` (racy ScatterND rewritten), ``body``
(the trace as a FunctionProto), ``verify`` (no aliasing, checker, eager match), ``derivation`` (per
exact site, cached). Bodies go into a model through ``exporters.resolve`` (with check guards, at the
model's opset), which asks the op's kind (``exporters.kinds``) where its body comes from.

Example:
    >>> import bridge, custom_ops
    >>> last_failure("opbridge::crop") is None
    True
"""

from exporters.derive.derivation import derive, last_failure
from exporters.derive.implementation import implementation
from exporters.derive.sites import Derived, NoPortableBody, Site, TensorSig, sample_site, site_of
from exporters.derive.verify import Crash, CrashSite, crash_sites, crashes_of, note_crashes

__all__ = ["Crash", "CrashSite", "Derived", "NoPortableBody", "Site", "TensorSig", "crash_sites", "crashes_of",
           "derive", "implementation", "last_failure", "note_crashes", "sample_site", "site_of"]
