"""core/filters.py on its own: which calls a step records under `scope`, `list`, `data_mode` and
`tensor_list`, decided from the keys in execution order (no framework: configs read as a user writes them)."""

from msprobe.core.config import config_from_dict
from msprobe.core.filters import DumpFilter


def dump_filter(tmp_path, level="L1", task="statistics", **options):
    return DumpFilter(config_from_dict({"task": task, "level": level, "dump_path": str(tmp_path),
                                        task: options}))


def test_no_scope_or_list_passes_every_call(tmp_path):
    f = dump_filter(tmp_path)
    assert not f.hit and f.want_call("Functional.linear.0.forward") and f.hit
    assert f.wants_forward("Functional.linear.0.forward") and not f.saves_tensor("Functional.linear.0.forward")


def test_list_selects_forward_and_backward_or_the_backward_alone(tmp_path):
    f = dump_filter(tmp_path, list=["Functional.relu", "Functional.linear.1.backward"])
    assert f.want_call("Functional.relu.0.forward") and f.wants_forward("Functional.relu.0.forward")
    assert f.want_call("Functional.linear.1.forward") and not f.wants_forward("Functional.linear.1.forward")
    assert not f.want_call("Functional.linear.0.forward") and not f.want_call("Tensor.add.0.forward")


def test_a_listed_module_selects_the_calls_inside_it(tmp_path):
    f = dump_filter(tmp_path, level="mix", list=["Module.fc1.Linear.forward.0"])
    assert f.want_call("Functional.linear.0.forward", enclosing=("Module.fc1.Linear.forward.0",))
    assert not f.want_call("Functional.linear.1.forward", enclosing=("Module.fc2.Linear.forward.0",))


def test_an_api_scope_opens_at_its_start_and_closes_after_its_end(tmp_path):
    f = dump_filter(tmp_path, scope=["Functional.linear.1.forward", "Functional.relu.1.forward"])
    keys = ["Functional.linear.0.forward", "Functional.linear.1.forward", "Tensor.add.0.forward",
            "Functional.relu.1.forward", "Functional.linear.2.forward"]
    assert [f.want_call(k) for k in keys] == [False, True, True, True, False]
    f.reset()  # a new step: the window opens again
    assert [f.want_call(k) for k in keys] == [False, True, True, True, False]


def test_a_module_scope_end_keeps_the_calls_inside_its_span(tmp_path):
    end = "Module.fc2.Linear.forward.0"
    f = dump_filter(tmp_path, level="mix", scope=["Module.fc1.Linear.forward.0", end])
    assert f.want_call("Module.fc1.Linear.forward.0")
    assert f.want_call(end)
    assert f.want_call("Functional.linear.1.forward", enclosing=(end,))  # inside the end module
    assert not f.want_call("Functional.relu.0.forward")  # after it
    assert not f.want_call("Functional.linear.2.forward", enclosing=(end,))  # the window stays shut


def test_tensor_list_saves_the_tensors_of_matching_calls_only(tmp_path):
    f = dump_filter(tmp_path, tensor_list=["Functional.softmax"])
    assert f.saves_tensor("Functional.softmax.0.forward") and not f.saves_tensor("Functional.linear.0.forward")
    assert dump_filter(tmp_path, task="tensor").saves_tensor("Functional.linear.0.forward")


def test_data_mode_picks_directions_and_roles(tmp_path):
    f = dump_filter(tmp_path, data_mode=["backward", "input"])
    assert (f.forward, f.backward, f.input, f.output) == (False, True, True, False)
    f = dump_filter(tmp_path, data_mode=["all"])
    assert (f.forward, f.backward, f.input, f.output) == (True, True, True, True)
