"""The names the benchmarks give what they time: keys of their JSON and labels of the README's rows,
typed once here. It imports nothing, so the README generators read them without loading torch."""

NATIVE, NATIVE_1T, FUNCTION, PYTHON = "ORT native", "ORT native 1 thread", "ORT function", "ORT python"
NATIVE_LONE, NATIVE_1T_LONE = "ORT native, lone call", "ORT native 1 thread, lone call"
EAGER, COMPILED = "eager torch", "torch.compile gather+index_add"
FLOOR, FLOOR_LONE = "memcpy (floor)", "memcpy (floor), lone call"


def native_path(isa: str) -> str:
    """The contender of the native library built with only the ``isa`` path and those below it."""
    return f"{NATIVE}, {isa} path"
