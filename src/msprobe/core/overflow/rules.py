"""Data tables for overflow analysis: which ops are collectives, and which make inf/nan on purpose."""

# Collectives where data flows from a source rank to the others (the source's input explains the others'
# outputs). Names are the API part of a key: `Distributed.broadcast.0.forward` -> `broadcast`.
DIRECTED_COLLECTIVES = frozenset({
    "send", "isend", "recv", "irecv", "broadcast", "scatter", "gather", "reduce", "batch_isend_irecv",
    "broadcast_object_list", "scatter_object_list", "gather_object",
})
# Collectives where every rank contributes to every rank's output.
UNDIRECTED_COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_object",
    "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all", "all_to_all_single",
    "AllReduce", "AllGather", "ReduceScatter", "AlltoAll", "Broadcast",
})
COLLECTIVES = DIRECTED_COLLECTIVES | UNDIRECTED_COLLECTIVES
# Prefixes our dumps and msProbe's give to collectives.
COLLECTIVE_PREFIXES = ("Distributed", "Communication")
# Receiving sides of point-to-point transfers: their output comes from a `send` on another rank.
RECEIVERS = frozenset({"recv", "irecv"})
SENDERS = frozenset({"send", "isend"})

# APIs whose inf/nan output is intended or meaningless: masks filled with -inf, uninitialised memory.
INTENDED_NONFINITE = frozenset({
    "full", "full_like", "new_full", "fill", "fill_", "masked_fill", "masked_fill_", "empty", "empty_like",
    "new_empty", "empty_strided", "new_empty_strided", "finfo",
})
