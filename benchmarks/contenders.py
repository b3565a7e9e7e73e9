"""The names the benchmarks give what they time: keys of their JSON and labels of the README's rows,
typed once here. It imports nothing, so the README generators read them without loading torch."""

NATIVE, NATIVE_1T, FUNCTION, PYTHON = "ORT native", "ORT native 1 thread", "ORT function", "ORT python"
NATIVE_LONE, NATIVE_1T_LONE = "ORT native, lone call", "ORT native 1 thread, lone call"
EAGER, COMPILED = "eager torch", "torch.compile gather+index_add"
# NOTE: the floor is bench::bev_pool_v2_floor (floor_op.py): every input byte read once, every output byte
# written once, in onnxruntime on the same intra-op threads as the native contender it is held against
FLOOR, FLOOR_1T, FLOOR_LONE = "floor", "floor 1 thread", "floor, lone call"
NATIVE_L1 = "ORT native, indices in L1"  # the issue bound: every index into a few L1-resident rows (bound.py)


def native_path(isa: str) -> str:
    """The contender of the native library built with only the ``isa`` path and those below it."""
    return f"{NATIVE}, {isa} path"
