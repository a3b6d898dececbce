"""Split API cases across workers so that each gets about the same work.

Cost of a case ~ elements of its tensors (inputs and outputs), doubled when it has a backward; cases
go to the least-loaded worker, biggest first (LPT), and each worker keeps dump order.
Must not import torch or mindspore.
"""

import heapq

from msprobe.core.acc_check.input_spec import iter_tensor_specs, spec_tree, UnsupportedArgument


def case_cost(case):
    try:
        tree = spec_tree([case.forward.get("input_args", []), case.forward.get("input_kwargs", {}),
                          case.forward.get("output", [])])
        elements = sum(s.numel for _, s in iter_tensor_specs(tree))
    except UnsupportedArgument:
        elements = 0
    return (1 + elements) * (2 if case.backward else 1)


def split_cases(cases, n):
    """`n` lists of cases, balanced by cost, each in the original order."""
    n = max(1, min(n, len(cases))) if cases else max(1, n)
    heap = [(0, i) for i in range(n)]
    owner = {}
    for idx in sorted(range(len(cases)), key=lambda i: -case_cost(cases[i])):
        load, w = heapq.heappop(heap)
        owner[idx] = w
        heapq.heappush(heap, (load + case_cost(cases[idx]), w))
    parts = [[] for _ in range(n)]
    for idx, case in enumerate(cases):
        parts[owner[idx]].append(case)
    return parts
