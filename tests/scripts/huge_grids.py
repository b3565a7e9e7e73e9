"""bev_pool_v2 with grids that are huge, overflow int64, or empty (C = 0), in every tier and eager.

Prints one JSON line per (case, tier): the error's class and message (null for none), the output
shape and the growth of the peak RSS over the call, in MiB. A few bytes of attributes must never
crash the process or allocate memory out of proportion to the output. Run in a subprocess by
tests/test_hostile.py, one tier per process so peak RSS is that tier's own.
Usage: huge_grids.py TIER   (eager, or a tier of bridge.TIERS)
"""

import json
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bad_inputs: single_node, attempt
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: op_db

from bad_inputs import attempt  # noqa: E402
from op_db import F32, OP_DB  # noqa: E402

ENTRY = OP_DB["bev::bev_pool_v2"]


def huge(a):  # 1e12 cells x 6 channels: no memory holds it
    a["bev_feat_shape"] = [1, 10**4, 10**4, 10**4, a["feat"].shape[-1]]


def overflow(a):  # the element count overflows int64
    a["bev_feat_shape"] = [2**31, 2**31, 2**31, 2**31, a["feat"].shape[-1]]


def empty_channels(a):  # 4e8 cells, C = 0: an empty output, which needs no memory
    a["feat"] = a["feat"][..., :0].contiguous()
    a["bev_feat_shape"] = [1, 1, 20_000, 20_000, 0]


CASES = {"huge": huge, "overflow": overflow, "empty_channels": empty_channels}


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(tier: str) -> int:
    spec = ENTRY.spec
    base = ENTRY.samples(F32)[0]
    for name, mutate in CASES.items():
        named = ENTRY.named(base.args)
        mutate(named)
        call = ENTRY.args(named)
        before, shape = peak_mib(), None
        if tier == "eager":
            try:
                shape, kind, message = list(spec.custom_op(*call).shape), None, None
            except Exception as e:  # the test judges the class and the message
                kind, message = type(e).__name__, str(e)
        else:
            kind, message = attempt(spec, tier, base.args, call)
        print(json.dumps({"case": name, "tier": tier, "type": kind, "error": message, "shape": shape,
                          "peak_growth_mib": peak_mib() - before}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
