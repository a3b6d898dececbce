"""A compare pair's typed rows grouped into calls, each row reduced to one relative error and its flags.

The diagnosis needs, per API or module call in execution order, how far each input and each output is
off. This module turns the typed row frame compare builds (`compare.frame.PairedRows`: keys, roles,
float statistics, match status) into `Call`s in dump order (= execution order), with `Row`s holding a
scale-free error (`errors.row_errors`), the floor below which the two values count as the same, and
flags for what no error number says (an argument changed, inf/nan appeared, shape or dtype kind
changed, checksums differ). Must not import torch or mindspore.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from msprobe.core import naming
from msprobe.core.compare.frame import STAT_FIELDS
from msprobe.core.compare.matching import INSIDE_FUSED
from msprobe.core.diagnosis.errors import (cross_framework, dtype_relation, noise_floor, row_errors, row_floor,
                                           unit_roundoff)
from msprobe.core.diagnosis.thresholds import CROSS_FRAMEWORK_NOISE, OPTIMIZER_UPDATE, VALUE_PRESERVING_APIS

# Flags: reasons a row differs that are not (only) a number.
DTYPE, NONFINITE, ARGUMENT, SHAPE, CHECKSUM = "dtype", "nonfinite", "argument", "shape", "checksum"
# metric names of the evidence (msProbe's column names) and the PairedRows arrays they come from
TENSOR_METRICS = (("Cosine", "cosine"), ("MaxRelativeErr", "max_rel"), ("One Thousandth Err Ratio", "one_k"))


@dataclass
class Row:
    """One tensor (or scalar argument) of one call, compared target vs golden."""

    index: int                # position in the compare table
    name: str
    role: str                 # "input" (args, kwargs, parameters; grads of outputs in backward) or "output"
    slot: str                 # "0", "dim", "weight", "1.0" ...
    is_tensor: bool
    is_parameter: bool
    matched: bool
    target_dtype: str
    golden_dtype: str
    numel: int | None
    dims: tuple               # the tensor's shape, () for scalars and unknown shapes
    target: tuple             # (max, min, mean, norm) of the target run, floats or None
    golden: tuple
    error: float = 0.0        # scale-free relative error, 0 = identical (see errors.row_errors)
    floor: float = 0.0        # below it the two values count as the same (rounding included)
    exact_floor: float = 0.0  # the golden dtype's own noise floor
    coarser: str | None = None  # the target's dtype when it is a coarser float than golden's
    layout_only: bool = False   # shapes differ, values do not: a view or layout golden takes otherwise
    cancelled: bool = False     # an output that cancelled to nearly zero (see flow._mark_cancelled)
    inside: bool = False        # no golden counterpart by construction (matching.INSIDE_FUSED)
    flags: set = field(default_factory=set)
    tensor_metrics: tuple = ()  # tensor mode: (Cosine, MaxRelativeErr, One Thousandth Err Ratio)
    l2_error: float = 0.0     # the error without its element-wise maximum term (see op_model.switches)
    label: str = ""           # the Diagnosis column (labels.py)

    @property
    def differs(self):
        """The two values differ beyond the rounding the run's precision allows."""
        return self.matched and (bool(self.flags) or self.error > self.floor)

    @property
    def range_hidden(self):
        """Golden's finite elements have no known range: its max or min is inf or nan (the target's
        too, else a flag says so) and the finite one is 0 (scores masked to -inf, all others <= 0), so
        the error relative to that range (a difference over a zero scale: full) measures nothing."""
        ends = [v for v in self.golden[:2] if type(v) is float]
        return (self.is_tensor and not self.flags and any(not math.isfinite(v) for v in ends)
                and all(v == 0 for v in ends if math.isfinite(v)))

    @property
    def target_finite(self):
        return all(v is None or not isinstance(v, float) or math.isfinite(v) for v in self.target)

    @property
    def golden_finite(self):
        return all(v is None or not isinstance(v, float) or math.isfinite(v) for v in self.golden)

    @property
    def golden_scale(self):
        """max(|Max|, |Min|) of the golden tensor (0.0 when unknown)."""
        scale = 0.0
        for v in self.golden[:2]:
            if type(v) is float and abs(v) > scale and v != math.inf:
                scale = abs(v)
        return scale

    @property
    def target_scale(self):
        """max(|Max|, |Min|) of the target tensor (0.0 when unknown)."""
        scale = 0.0
        for v in self.target[:2]:
            if type(v) is float and abs(v) > scale and v != math.inf:
                scale = abs(v)
        return scale

    def value_key(self):
        """What identifies this tensor's value in the target run (for finding who produced it), or None
        for values too plain to tell apart (scalars, constants, empty tensors)."""
        return self._value_key

    def __post_init__(self):
        t = self.target  # a tensor's statistics are floats or None (calls_from_rows)
        plain = not self.is_tensor or None in t or t[0] == t[1]
        self._value_key = None if plain else (self.numel,) + t


@dataclass
class Call:
    """One API or module call (or parameter-gradient record) with its rows, in execution order."""

    key: str
    order: int
    direction: str            # "forward", "backward" (parameters_grad counts as backward) or "debug"
    is_module: bool
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    stack: list = field(default_factory=list)  # stack lines, innermost first

    def __post_init__(self):
        base, direction, _ = naming.split_key(self.key)
        prefix, rest = naming.split_base(base)
        plain = self.is_module or direction in ("", "parameters_grad") or rest is None
        self._api = None if plain else rest
        self.short_api = None if plain else rest.rpartition(".")[2]  # 'softmax' of Functional.nn.softmax.0.forward
        if prefix == naming.OPTIMIZER_PREFIX:  # Optimizer.SGD.fc.weight.0.forward: the parameter's update
            self.short_api = OPTIMIZER_UPDATE

    @property
    def rows(self):
        return self.inputs + self.outputs

    @property
    def matched(self):
        return any(r.matched for r in self.rows)

    @property
    def is_param_grad(self):
        return ".parameters_grad." in self.key

    @property
    def api_name(self):
        """'linear' for Functional.linear.0.forward, None for modules and parameter gradients."""
        return self._api


def direction_of(key):
    if key.endswith(".debug"):
        return "debug"
    if ".backward" in key or ".parameters_grad." in key:
        return "backward"
    return "forward"


def _slot(role, suffix):
    """(diagnosis role, slot, is_parameter) of a row from its rows.py role and name suffix."""
    if role == "grad":  # parameters_grad: the gradients are what the record produced
        return "output", suffix[1:], False
    if role == "debug":
        return "output", suffix[1:], False
    if suffix.startswith(".parameters."):
        return "input", suffix[len(".parameters."):], True
    head = "." + role + "."
    return role, (suffix[len(head):] if suffix.startswith(head) else suffix.lstrip(".")), False


def calls_from_rows(paired, stacks=None, working_u=0.0):
    """The calls of one compare pair, in dump order, with every row's error, floor and flags.

    Args:
        paired: `compare.frame.PairedRows` of the pair.
        stacks: call key -> stack lines (the target's stack.json).
        working_u: unit roundoff of the run's working precision (0.0: none coarser than golden's).

    Returns:
        list[Call].
    """
    target, golden = paired.target, paired.golden
    n = len(paired)
    matched = paired.matched
    gidx = getattr(paired, "gidx", None)
    inside = (gidx == INSIDE_FUSED) if gidx is not None and (gidx == INSIDE_FUSED).any() else None
    t, tp = paired.stats("target")
    g, gp = paired.stats("golden")
    errors, nonfinite = row_errors(t, tp, g, gp, paired.metric("euc"), paired.metric("max_abs"))
    l2_errors = row_errors(t, tp, g, gp, paired.metric("euc"), np.full(n, np.nan))[0].tolist()
    moved = (paired.metrics or {}).get("nonfinite_moved")
    metrics = [paired.metric(m) for _, m in TENSOR_METRICS] if paired.metrics is not None else None
    cols = {c: target[c].tolist() for c in ("name", "key", "suffix", "role", "kind", "dtype", "shape", "dims")}
    g_cols = {c: golden[c].tolist() for c in ("kind", "dtype", "shape")}
    t_raw = {f: target[f].tolist() for f in STAT_FIELDS}
    g_raw = {f: golden[f].tolist() for f in STAT_FIELDS}
    t_md5 = target["md5"].tolist()
    g_md5 = golden["md5"].tolist()
    t_rows, g_rows = _stat_tuples(t, tp), _stat_tuples(g, gp)
    errors, nonfinite = errors.tolist(), nonfinite.tolist()
    stacks = stacks or {}
    calls, by_key = [], {}
    for i in range(n):
        key = cols["key"][i]
        call = by_key.get(key)
        if call is None:
            call = Call(key=key, order=len(calls), direction=direction_of(key), is_module=naming.is_module_key(key),
                        stack=[str(x) for x in stacks.get(key) or ()])
            by_key[key] = call
            calls.append(call)
        role, slot, is_param = _slot(cols["role"][i], cols["suffix"][i])
        is_tensor = cols["kind"][i] == "tensor"
        if is_tensor:
            tv, gv = t_rows[i], g_rows[i]
        else:  # scalar arguments: the value itself (may be text: a slice, a dtype, a string)
            tv = tuple(t_raw[f][i] for f in STAT_FIELDS)
            gv = tuple(g_raw[f][i] for f in STAT_FIELDS)
        row = Row(index=i, name=cols["name"][i], role=role, slot=slot, is_tensor=is_tensor, is_parameter=is_param,
                  matched=bool(matched[i]), target_dtype=str(cols["dtype"][i]), golden_dtype=str(g_cols["dtype"][i]),
                  numel=_numel(cols["dims"][i]) if is_tensor else None,
                  dims=(cols["dims"][i] or ()) if is_tensor else (),
                  target=tv, golden=gv,
                  inside=bool(inside[i]) if inside is not None else False)
        if row.matched:
            _judge(row, cols["shape"][i], g_cols["shape"][i], g_cols["kind"][i], errors[i], nonfinite[i],
                   bool(moved[i]) if moved is not None else False, t_md5[i], g_md5[i], working_u)
            if metrics is not None and is_tensor:
                row.tensor_metrics = tuple(float(m[i]) for m in metrics)
            row.l2_error = min(row.error, l2_errors[i])
        (call.inputs if role == "input" else call.outputs).append(row)
    return calls


@functools.lru_cache(maxsize=4096)
def _numel(dims):
    """Element count of a row's dimensions, None when its shape is unknown."""
    return None if dims is None else math.prod(dims)


def _stat_tuples(values, present):
    """Per row, (max, min, mean, norm) as floats, None where absent."""
    obj = values.astype(object)
    obj[~present] = None
    return list(map(tuple, obj.tolist()))


def _judge(row, t_shape, g_shape, g_kind, error, nonfinite, moved, t_md5, g_md5, working_u):
    """Fill a matched row's error, floors and flags."""
    if not row.is_tensor:
        # A scalar argument stands in its own statistics columns; a changed one is a changed program,
        # except a dtype argument moving between float precisions (autocast's `.to(bfloat16)`).
        if not _same_argument(row.target[0], row.golden[0], row.target_dtype, row.golden_dtype):
            row.flags.add(ARGUMENT)
            row.error = math.inf
        return
    kind, coarser, exact_floor, floor = _floors(row.target_dtype, row.golden_dtype, working_u)
    row.coarser = coarser
    if kind == "other" or g_kind != "tensor":
        row.flags.add(DTYPE)
    row.exact_floor, row.floor = exact_floor, floor
    row.error = float(error)
    if nonfinite:
        row.flags.add(NONFINITE)
    elif moved:  # tensor mode: both sides hold inf/nan (same statistics) but not in the same elements
        row.flags.add(NONFINITE)
        row.error = math.inf
    if str(t_shape) != str(g_shape):
        if row.error > row.floor or row.flags:
            row.flags.add(SHAPE)
        else:
            row.layout_only = True
    if isinstance(t_md5, str) and isinstance(g_md5, str) and t_md5 != g_md5:
        # md5 mode asks for bitwise equality: different bytes are a difference whatever the size
        row.flags.add(CHECKSUM)


@functools.lru_cache(maxsize=512)
def _floors(t_dtype, g_dtype, working_u):
    """(dtype relation, coarser target dtype, golden's own floor, the row's floor): a table has a handful
    of dtype pairs."""
    kind, coarser = dtype_relation(t_dtype, g_dtype)
    exact = noise_floor(g_dtype) if kind != "integer" else 0.0
    if kind != "integer" and cross_framework(t_dtype, g_dtype):
        exact *= CROSS_FRAMEWORK_NOISE
    return kind, coarser, exact, row_floor(t_dtype, g_dtype, working_u)


def _same_argument(a, b, a_type, b_type):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, str) and isinstance(b, str) and a != b:
        kind, _ = dtype_relation(a, b)
        return kind in ("coarser", "finer", "integer")
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return a == b  # 2 and 2.0: frameworks record numbers with their own types
    return a == b and a_type == b_type


def dtype_census(result):
    """({coarser target dtype: rows}, float rows) over a pair's matched float tensor rows: the rows
    where the target holds a coarser float than golden, by that dtype, and how many rows were looked at."""
    counts, total = {}, 0
    p = getattr(result, "rows", None)
    if p is None or not len(p):
        return counts, total
    sel = p.matched & (p.target["kind"].to_numpy(dtype=object) == "tensor")
    if not sel.any():
        return counts, total
    pairs = {}
    for t, g in zip(p.target["dtype"].to_numpy(dtype=object)[sel], p.golden["dtype"].to_numpy(dtype=object)[sel]):
        pairs[(t, g)] = pairs.get((t, g), 0) + 1
    for (t, g), k in pairs.items():
        if unit_roundoff(t) and unit_roundoff(g):
            total += k
            relation, coarser = dtype_relation(str(t), str(g))
            if relation == "coarser":
                counts[coarser] = counts.get(coarser, 0) + k
    return counts, total


def implicit_lowering(result):
    """The coarser float dtypes some computing call of the target returns from finer inputs without a
    cast of its own (autocast's mark: `linear` reads float32 and returns bfloat16), however few rows
    show them (a GRU model under autocast holds bf16 in its head only). A cast the program makes is a
    cast call, and does not count."""
    p = getattr(result, "rows", None)
    if p is None or not len(p):
        return set()
    keys = p.target["key"].to_numpy(dtype=object)
    roles = p.target["role"].to_numpy(dtype=object)
    dtypes = p.target["dtype"].to_numpy(dtype=object)
    tensor = p.target["kind"].to_numpy(dtype=object) == "tensor"
    out = p.matched & tensor & (roles == "output")
    g_dtypes = p.golden["dtype"].to_numpy(dtype=object)
    candidates = {}
    for i in np.flatnonzero(out):
        relation, coarser = dtype_relation(str(dtypes[i]), str(g_dtypes[i]))
        key = keys[i]
        if relation == "coarser" and coarser not in candidates.values() and _computes(key):
            candidates.setdefault(key, coarser)
    if not candidates:
        return set()
    lowered = set()
    inputs = {}
    for i in np.flatnonzero(tensor & (roles == "input") & np.isin(keys, list(candidates))):
        inputs.setdefault(keys[i], []).append(str(dtypes[i]))
    for key, coarser in candidates.items():
        floats = [d for d in inputs.get(key, ()) if unit_roundoff(d)]
        if floats and all(unit_roundoff(d) < unit_roundoff(coarser) for d in floats):
            lowered.add(coarser)
    return lowered


def _computes(key):
    """A forward API call that is not a cast, view or copy."""
    base, direction, _ = naming.split_key(key)
    prefix, rest = naming.split_base(base)
    return (direction == naming.FORWARD and key.endswith(naming.FORWARD) and rest is not None
            and prefix not in naming.MODULE_PREFIXES and rest.rpartition(".")[2] not in VALUE_PRESERVING_APIS)


def working_precision(counts, total, share, lowered=()):
    """(dtype, unit roundoff) of the run's working precision, or (None, 0.0), from `dtype_census`
    counts summed over all pairs: the coarsest float dtype that the target holds where golden holds a
    finer one, in at least `share` of the `total` matched float tensor rows (or a coarser dtype does),
    or that computing calls return from finer inputs by themselves (`lowered`: `implicit_lowering`).
    """
    if not total or not counts:
        return None, 0.0
    best = None
    for dtype in sorted(counts, key=unit_roundoff):  # finest first: a coarser one also covers it
        covered = sum(k for d, k in counts.items() if unit_roundoff(d) >= unit_roundoff(dtype))
        if covered >= share * total or dtype in lowered:
            best = dtype
    return (best, unit_roundoff(best)) if best else (None, 0.0)

