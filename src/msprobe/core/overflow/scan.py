"""Walk one rank directory in execution order and classify each node's inputs and outputs as finite or not.

dump.json's key order is the order the calls finished on that rank (forward, then its backward, then the
optimizer), so the position of a node is its place in time within the step.
"""

from dataclasses import dataclass

from msprobe.core.dump.reader import DumpReader
from msprobe.core.naming import forward_of, split_base, split_key
from msprobe.core.overflow.finiteness import values_finite
from msprobe.core.overflow.rules import (COLLECTIVE_PREFIXES, COLLECTIVES, INTENDED_NONFINITE, RECEIVERS,
                                         SENDERS)

# Record fields that hold what a node consumed; every other field (output, gradients) is what it produced.
_INPUT_FIELDS = ("input_args", "input_kwargs", "input", "parameters")


@dataclass
class NodeState:
    """One dump record with the finiteness of its inputs and outputs.

    Attributes:
        key: the dump key, e.g. ``Torch.exp.0.forward``.
        index: position in the rank's dump.json (execution order).
        comm_before: how many collectives this rank ran before this node (a clock shared by all ranks).
        api: the API or module part of the key (``exp``, ``all_reduce``), used to match collectives.
    """

    key: str
    index: int
    comm_before: int
    inputs_finite: bool
    outputs_finite: bool
    is_collective: bool
    api: str

    @property
    def is_origin(self):
        """Finite in, non-finite out: this node made the inf/nan (unless a peer rank fed it)."""
        return self.inputs_finite and not self.outputs_finite

    @property
    def is_receiver(self):
        return self.api in RECEIVERS

    @property
    def is_sender(self):
        return self.api in SENDERS


def split_record(record):
    """(inputs, outputs) of a record, whatever its kind (API, module, parameters_grad, debug value)."""
    if not isinstance(record, dict):
        return [], [record]
    if "type" in record and ("shape" in record or "value" in record):  # a bare value: debug.json
        return [], [record]
    inputs = [record[f] for f in _INPUT_FIELDS if f in record]
    outputs = [v for f, v in record.items() if f not in _INPUT_FIELDS]
    return inputs, outputs


def _api_name(key):
    base, _, _ = split_key(key)
    parts = base.split(".")
    return parts[-1] if len(parts) >= 2 and parts[0] not in ("Module", "Cell") else base


def scan_rank(rank_dir):
    """NodeStates of every record of one rank directory, in execution order.

    Returns:
        (DumpReader, list[NodeState])
    """
    reader = DumpReader(rank_dir)
    nodes = []
    comm = 0
    forward_finite = {}  # forward key -> inputs and outputs finite
    tainted = set()  # key bases (API or module) with a non-finite forward: their gradients echo it
    for index, (key, record) in enumerate(reader.items()):
        api = _api_name(key)
        base, direction, _ = split_key(key)
        is_comm = split_base(key)[0] in COLLECTIVE_PREFIXES and api in COLLECTIVES
        inputs, outputs = split_record(record)
        inputs_finite = values_finite(inputs, reader)
        outputs_finite = values_finite(outputs, reader)
        if api in INTENDED_NONFINITE and not outputs_finite:
            # a -inf mask or uninitialised buffer; whatever consumes it is judged on its own
            outputs_finite = True
        if direction == "forward":
            forward_finite[key] = inputs_finite and outputs_finite
            if not forward_finite[key]:
                tainted.add(base)
        elif direction == "backward":
            # a backward also reads what its forward saved (inputs, outputs): a nan there is not new
            inputs_finite = inputs_finite and forward_finite.get(forward_of(key), True)
        elif direction == "parameters_grad":
            inputs_finite = base not in tainted
        nodes.append(NodeState(key, index, comm, inputs_finite, outputs_finite, is_comm, api))
        if is_comm:
            comm += 1
    return reader, nodes
