"""ONNX Runtime kernels for registered ops: the native C++ library (built and loaded here).

``ort_kernels/cpu/<op>.cc`` holds an op's C++ kernel; ``register.cc`` exports
``RegisterCustomOps(OrtSessionOptions*, const OrtApiBase*)`` for any ONNX Runtime host.
"""

from ort_kernels.build import library_path, native_entries, native_source, served_ops

__all__ = ["library_path", "native_entries", "native_source", "served_ops"]
