"""The statistics a monitor can record per tensor, and a numpy reference for them.

`OPS` is the table of names accepted in the config's `ops` field. Adapters compute the same numbers on
their own device (see `msprobe.pytorch.monitor.stats`); `stats_from_array` is the numpy definition,
used by the MindSpore adapter and by the tests as the oracle. Must not import torch or mindspore.
"""

import numpy as np

from msprobe.core.errors import ConfigError

# name -> meaning (the `ops` values the config accepts, in the column order of a default config).
OPS = {
    "norm": "L2 norm of all elements",
    "min": "smallest element",
    "max": "largest element",
    "mean": "mean of all elements",
    "zeros": "fraction of elements with |x| < eps",
    "nans": "number of NaN elements",
}
DEFAULT_OPS = ("norm",)


def chosen_ops(ops, field="ops", value=None):
    """`ops` as a list, checked: at least one, each a name of OPS (ConfigError naming `field` and the
    `value` the user wrote otherwise)."""
    ops = list(ops)
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise ConfigError(field, ops if value is None else value, "a comma list of " + ", ".join(OPS))
    return ops


def stats_from_array(array, ops, eps):
    """Compute `ops` of one array in float64 (the numpy oracle of the adapters' batched versions).

    Args:
        array: a numpy array (any float or int dtype; bool is counted as 0/1).
        ops: names from `OPS`, in output order.
        eps: threshold of `zeros`.

    Returns:
        list of floats, one per op; nan for an empty array (except `nans`/`zeros`, which are 0).
    """
    x = np.asarray(array, dtype=np.float64).ravel()
    out = []
    for op in ops:
        if op == "nans":
            out.append(float(np.isnan(x).sum()))
        elif op == "zeros":
            out.append(float((np.abs(x) < eps).mean()) if x.size else 0.0)
        elif x.size == 0:
            out.append(float("nan"))
        elif op == "norm":
            out.append(float(np.linalg.norm(x)))
        elif op == "min":
            out.append(float(x.min()))
        elif op == "max":
            out.append(float(x.max()))
        elif op == "mean":
            out.append(float(x.mean()))
        else:
            raise KeyError(op)
    return out
