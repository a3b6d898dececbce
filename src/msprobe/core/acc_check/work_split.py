"""Share API cases between workers so that each gets about the same work.

Cost of a case ~ elements of its tensors (inputs and outputs), doubled when it has a backward.
Workers take cases from one queue, biggest first, each taking the next one when it is free (online
LPT): a worker that other processes slow down simply takes fewer, where a split fixed in advance by
estimated cost would leave the other worker idle at the end.
Must not import torch or mindspore.
"""

from msprobe.core.acc_check.input_spec import iter_tensor_specs, spec_tree, UnsupportedArgument


def case_cost(case):
    try:
        tree = spec_tree([case.forward.get("input_args", []), case.forward.get("input_kwargs", {}),
                          case.forward.get("output", [])])
        elements = sum(s.numel for _, s in iter_tensor_specs(tree))
    except UnsupportedArgument:
        elements = 0
    return (1 + elements) * (2 if case.backward else 1)


def biggest_first(cases):
    """The cases ordered by decreasing cost (dump order among equals): the order workers take them."""
    costs = [case_cost(c) for c in cases]
    return [cases[i] for i in sorted(range(len(cases)), key=lambda i: -costs[i])]
