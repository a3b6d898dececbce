"""msprobe.core.naming: the dump key grammar (msprobe-facts §3.3) and the per-step call counter."""

import pytest

from msprobe.core import naming
from msprobe.core.naming import CallCounter, split_key


@pytest.mark.parametrize("key, expected", [
    # API calls: {Prefix}.{api}.{n}.{direction}
    ("Functional.linear.3.backward", ("Functional.linear", "backward", 3)),
    ("Functional.relu.0.forward", ("Functional.relu", "forward", 0)),
    ("Tensor.__add__.12.forward", ("Tensor.__add__", "forward", 12)),
    ("Torch.matmul.0.backward", ("Torch.matmul", "backward", 0)),
    ("Distributed.all_reduce.0.forward", ("Distributed.all_reduce", "forward", 0)),
    ("VF.lstm.99.forward", ("VF.lstm", "forward", 99)),
    ("Functional.conv2d.1.forward", ("Functional.conv2d", "forward", 1)),  # api name ends in a digit
    ("Primitive.dense.Dense.0.forward", ("Primitive.dense.Dense", "forward", 0)),  # MindSpore
    ("MintFunctional.relu.4.backward", ("MintFunctional.relu", "backward", 4)),
    # module calls: {Module|Cell}.{path}.{Class}.{direction}.{n}
    ("Module.conv1.Conv2d.forward.0", ("Module.conv1.Conv2d", "forward", 0)),
    ("Module.conv1.Conv2d.backward.7", ("Module.conv1.Conv2d", "backward", 7)),
    ("Module.body.0.Linear.forward.0", ("Module.body.0.Linear", "forward", 0)),  # numeric path part
    ("Module.0.conv1.Conv2d.forward.2", ("Module.0.conv1.Conv2d", "forward", 2)),  # model list index
    ("Module.layers.10.attn.Attention.backward.11", ("Module.layers.10.attn.Attention", "backward", 11)),
    ("Cell.fc1.Linear.forward.0", ("Cell.fc1.Linear", "forward", 0)),
    # parameter gradients
    ("Module.conv1.Conv2d.parameters_grad.0", ("Module.conv1.Conv2d", "parameters_grad", 0)),
    ("Module.body.2.Linear.parameters_grad.3", ("Module.body.2.Linear", "parameters_grad", 3)),
    ("Cell.fc1.Linear.parameters_grad.1", ("Cell.fc1.Linear", "parameters_grad", 1)),
    # single-point save
    ("x2.0.debug", ("x2", "debug", 0)),
    ("x2_grad.5.debug", ("x2_grad", "debug", 5)),
    ("layer.out.3.debug", ("layer.out", "debug", 3)),
])
def test_split_key(key, expected):
    assert split_key(key) == expected


@pytest.mark.parametrize("key", ["", "optimizer", "Functional.linear", "Functional.linear.forward",
                                 "Functional.linear.x.forward", "Module.a.A.forward.x", "debug",
                                 "name.debug"])
def test_split_key_not_a_call_key(key):
    assert split_key(key) == (key, "", -1)


def test_forward_and_backward_share_base():
    for fwd, bwd in [("Functional.linear.3.forward", "Functional.linear.3.backward"),
                     ("Module.a.b.Linear.forward.1", "Module.a.b.Linear.backward.1")]:
        f, b = split_key(fwd), split_key(bwd)
        assert f[0] == b[0] and f[2] == b[2]
        assert (f[1], b[1]) == ("forward", "backward")


def test_forward_of_is_backward_of_undone():
    for fwd in ("Functional.linear.3.forward", "Functional.nn.softmax.0.forward", "Module.a.0.b.Linear.forward.1",
                "Cell.fc1.Dense.forward.2", "Optimizer.SGD.fc.weight.0.forward"):
        assert naming.forward_of(naming.backward_of(fwd)) == fwd
    assert naming.forward_of("Module.body.2.Linear.parameters_grad.3") == "Module.body.2.Linear.forward.3"
    for other in ("Functional.linear.3.forward", "Module.a.Linear.forward.0", "x2.0.debug", "not_a_key"):
        assert naming.forward_of(other) is None


def test_module_class():
    assert naming.module_class("Module.ff.1.ReLU.backward.0") == "ReLU"
    assert naming.module_class("Cell.fc1.Dense.forward.2") == "Dense"
    assert naming.module_class("Module.conv1.Conv2d.parameters_grad.0") == "Conv2d"
    assert naming.module_parts("Module.layers.10.attn.Attention.backward.11") == ("Module", "layers.10.attn", "Attention")
    for other in ("Functional.relu.0.forward", "x2.0.debug", "Module.forward.0", "not_a_key"):
        assert naming.module_class(other) is None


def test_builders_round_trip_through_split_key():
    assert naming.api_key("Functional", "linear", 3, naming.FORWARD) == "Functional.linear.3.forward"
    assert split_key(naming.api_key("Tensor", "add_", 2, naming.BACKWARD)) == ("Tensor.add_", "backward", 2)
    assert naming.module_key("Module", "conv1", "Conv2d", "forward", 0) == "Module.conv1.Conv2d.forward.0"
    assert split_key(naming.module_key("Module", "a.0.b", "Linear", "backward", 4)) == \
        ("Module.a.0.b.Linear", "backward", 4)
    assert naming.params_grad_key("Module", "conv1", "Conv2d", 0) == "Module.conv1.Conv2d.parameters_grad.0"
    assert naming.debug_key("x2", 0) == "x2.0.debug"
    assert naming.debug_key("x2", 1, grad=True) == "x2_grad.1.debug"
    assert split_key(naming.debug_key("x2", 1, grad=True)) == ("x2_grad", "debug", 1)


def test_file_names():
    assert naming.tensor_file_name("Functional.linear.5.backward", "output", (0,), ".pt") == \
        "Functional.linear.5.backward.output.0.pt"
    assert naming.tensor_file_name("VF.lstm.99.forward", "input", (1, 0), ".pt") == \
        "VF.lstm.99.forward.input.1.0.pt"
    assert naming.tensor_file_name("Module.fc.Linear.forward.0", "parameters", ("weight",), ".npy") == \
        "Module.fc.Linear.forward.0.parameters.weight.npy"
    assert naming.tensor_file_name("k", "output", (), ".pt") == "k.output.pt"
    assert naming.debug_file_name("x2.0.debug", (), ".pt") == "x2.0.debug.pt"
    assert naming.debug_file_name("x2.0.debug", ("a", 1), ".npy") == "x2.0.debug.a.1.npy"


def test_is_module_key():
    assert naming.is_module_key("Module.conv1.Conv2d.forward.0")
    assert naming.is_module_key("Cell.fc1.Linear.parameters_grad.0")
    assert not naming.is_module_key("Functional.linear.0.forward")
    assert not naming.is_module_key("Modules.x.0.forward")


def test_call_counter_counts_per_name():
    c = CallCounter()
    assert [c.next("Functional.linear") for _ in range(3)] == [0, 1, 2]
    assert c.next("Functional.relu") == 0
    assert c.next("Functional.linear") == 3
    assert c.next("Module.fc.Linear") == 0
    assert c.next("Functional.relu") == 1


def test_call_counter_reset():
    c = CallCounter()
    c.next("a"), c.next("a"), c.next("b")
    c.reset()
    assert c.next("a") == 0 and c.next("b") == 0


def test_call_counters_are_independent():
    a, b = CallCounter(), CallCounter()
    a.next("x")
    assert b.next("x") == 0 and a.next("x") == 1
