"""The ground floor: errors, dtypes, domains, op specs, ONNX schemas, checks, the registry and the op object.

It knows torch schemas and ONNX schemas, nothing about exporting or running; every name, dtype
correspondence and domain set is written here once. Nothing here imports ``exporters``,
``ort_kernels`` or ``bridge.tools``.
"""
