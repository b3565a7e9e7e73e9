"""ONNX Runtime kernels for registered ops, as tiers (``ort_kernels.tiers``): model-local function
bodies, the native C++ library (``cpu/<domain>_op_<op type>.cc``, ``register.cc``, built by ``build``), Python kernels.

``register.cc`` exports ``RegisterCustomOps(OrtSessionOptions*, const OrtApiBase*)`` for any ONNX
Runtime host.
"""
