import os

import pytest
import torch

import bridge
import custom_ops  # noqa: F401  (registers the seed ops)


@pytest.fixture
def registry():
    """A private registry; ops declared in it are removed from onnx's schema table afterwards."""
    reg = bridge.Registry()
    yield reg
    for spec in list(reg):
        reg.remove(spec.qualname)


_counter = iter(range(10**6))


@pytest.fixture
def fresh_name():
    """A torch namespace::name nobody declared yet (torch ops cannot be undefined)."""
    return lambda base="op": f"t{next(_counter)}::{base}"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_addoption(parser):
    parser.addoption("--heavy", action="store_true",
                     help="heavier reliability runs: slow-marked tests and 200 hypothesis examples per property")


def pytest_configure(config):
    if config.getoption("--heavy"):
        os.environ.setdefault("OPBRIDGE_EXAMPLES", "200")
        os.environ.setdefault("OPBRIDGE_FUZZ_EXAMPLES", "1000")
        os.environ.setdefault("OPBRIDGE_SESSIONS", "10000")
        os.environ.setdefault("OPBRIDGE_SOAK_RUNS", "10000")
        config.option.markexpr = ""  # run the slow-marked tests too




@pytest.fixture
def bare_op_model(registry, fresh_name, tmp_path):
    """(name, path): a model calling an op that has a fake kernel and nothing else (no function
    body, no C++ kernel, a NumPy implementation no body can be derived from), exported with the
    private registry."""
    name = fresh_name("bare")

    @bridge.op(name, fake=lambda x: torch.empty_like(x), registry=registry)
    def bare(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.numpy().copy())

    class M(torch.nn.Module):
        def forward(self, x):
            return bare(x)

    path = tmp_path / "bare.onnx"
    bridge.export(M(), (torch.ones(2),), path, registry=registry)
    return name, path
