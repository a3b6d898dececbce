"""Share API cases between workers so that each gets about the same work.

Workers take cases from one queue, each taking the next one when it is free: a worker that other
processes slow down simply takes fewer, where a split fixed in advance would leave the other worker
idle at the end. The queue is in dump order, so that the APIs a worker runs one after another have
tensors of similar sizes and its allocator reuses the same blocks (biggest first over the whole dump
walks down through every tensor size, each a fresh allocation). Only the last tenth of the estimated work
goes biggest first, so that a big API at the end of the dump does not leave one worker running alone.
Cost of a case ~ elements of its tensors (inputs and outputs), doubled when it has a backward.
Must not import torch or mindspore.
"""

from msprobe.core.acc_check.input_spec import iter_tensor_specs, spec_tree, UnsupportedArgument

TAIL_SHARE = 0.1  # of the estimated work: taken biggest first at the end


def case_cost(case):
    try:
        tree = spec_tree([case.forward.get("input_args", []), case.forward.get("input_kwargs", {}),
                          case.forward.get("output", [])])
        elements = sum(s.numel for _, s in iter_tensor_specs(tree))
    except UnsupportedArgument:
        elements = 0
    return (1 + elements) * (2 if case.backward else 1)


def work_order(cases, tail_share=TAIL_SHARE):
    """The order workers take `cases` in: dump order, then the last `tail_share` of the estimated
    work biggest first (dump order among equals)."""
    costs = [case_cost(c) for c in cases]
    split, tail_cost, tail_limit = len(cases), 0, tail_share * sum(costs)
    while split > 0 and tail_cost < tail_limit:
        split -= 1
        tail_cost += costs[split]
    tail = sorted(range(split, len(cases)), key=lambda i: -costs[i])
    return list(cases[:split]) + [cases[i] for i in tail]
