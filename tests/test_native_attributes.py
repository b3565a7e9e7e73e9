"""The native kernels name the type of a wrong-typed attribute: floats given for an ints attribute
(which ONNX Runtime's array getter reads as an empty list) and a float for an int are reported with
what the node holds."""

import onnxruntime as ort
import pytest
from onnx import helper

import bridge
from ort_kernels import build


@pytest.fixture(scope="module")
def library():
    return str(build.library_path())


def _session_error(library, qualname, attributes) -> str:
    spec = bridge.REGISTRY.get(qualname)
    inputs, outputs = build.io_types(spec, spec.dtypes[0])
    names = [p.name for p in spec.tensors]
    node = helper.make_node(spec.name, names, [f"out{i}" for i in range(len(outputs))], domain=spec.domain,
                            **attributes)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, inputs, strict=True)],
        [helper.make_tensor_value_info(f"out{i}", t, None) for i, t in enumerate(outputs)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid(spec.domain, spec.version)])
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    with pytest.raises(Exception) as err:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return str(err.value)


def test_floats_for_an_ints_attribute_name_the_floats(library):
    message = _session_error(library, "bev::bev_pool_v2", {"bev_feat_shape": [1.5, 2.0, 3.0, 4.0, 5.0]})
    assert "attribute 'bev_feat_shape' must be ints, got floats [1.5, 2, 3, 4, 5]" in message
    assert "got []" not in message


def test_a_float_for_an_int_attribute_names_the_float(library):
    message = _session_error(library, "opbridge::identity_conv", {"channels": 3.5})
    assert "attribute 'channels' must be an int, got a float 3.5" in message


def test_a_missing_attribute_is_named(library):
    message = _session_error(library, "opbridge::identity_conv", {})
    assert "attribute 'channels' is missing" in message
