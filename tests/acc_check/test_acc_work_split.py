"""The order workers take cases in: dump order (similar sizes one after another), the last tenth of
the estimated work biggest first (workers finish together)."""

from msprobe.core.acc_check.input_spec import cases_from_dump
from msprobe.core.acc_check.work_split import case_cost, work_order


def _record(n):
    return {"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [n], "Max": 1.0,
                            "Min": -1.0, "requires_grad": False}], "input_kwargs": {}, "output": []}


def _cases(sizes):
    return cases_from_dump({f"Torch.op{i}.0.forward": _record(n) for i, n in enumerate(sizes)})


def test_dump_order_then_the_tail_biggest_first():
    # costs 51 x 20, then 11, 31, 21 (elements + 1): the last tenth (108 of 1083) reaches back into op19
    cases = _cases([50] * 20 + [10, 30, 20])
    order = [c.name for c in work_order(cases)]
    assert order[:19] == [c.name for c in cases[:19]]
    assert order[19:] == ["Torch.op19.0", "Torch.op21.0", "Torch.op22.0", "Torch.op20.0"]


def test_a_big_api_at_the_end_is_taken_before_the_small_ones_around_it():
    cases = _cases([10] * 50 + [1000, 5, 5])
    order = [c.name for c in work_order(cases)]
    assert order.index("Torch.op50.0") < order.index("Torch.op51.0")
    assert sorted(order) == sorted(c.name for c in cases) and len(order) == len(cases)
    assert case_cost(cases[50]) > case_cost(cases[51])


def test_empty_and_single():
    assert work_order([]) == []
    one = _cases([7])
    assert work_order(one) == one
