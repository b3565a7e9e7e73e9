"""opbridge: declare a torch custom op once; export it to ONNX, run it in ONNX Runtime, prove parity.

Example:
    >>> import torch, bridge, custom_ops
    >>> sorted(s.qualname for s in bridge.REGISTRY)[:2]
    ['bev::bev_pool_v2', 'opbridge::crop']
"""

from bridge.errors import OpBridgeError, UnsupportedInTier
from bridge.registry import REGISTRY, Registry, op
from bridge.spec import OpSpec, SampleInput
from bridge.session import session
from bridge.parity import ParityReport, assert_parity, check_parity, compare
from exporters.export import export

__all__ = [
    "OpBridgeError", "UnsupportedInTier", "REGISTRY", "Registry", "op", "OpSpec", "SampleInput",
    "export", "session", "check_parity", "assert_parity", "compare", "ParityReport",
]
