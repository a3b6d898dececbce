"""Pair the rows of a target dump with the rows of a golden dump (msprobe-facts §8.3).

Records are paired first (exact keys; backward calls renumbered by order of occurrence so activation
recomputation does not shift them; or, with `fuzzy`, an alignment of the call sequences that ignores
call indices), then the tensors of paired records by their position (`.input.0`, `.output.1`).
Mappings rename target keys before pairing: MindSpore -> PyTorch API names, cell/module paths, layer
children, and finally explicit per-tensor names. Pairs whose dtypes cannot belong together are undone.
Must not import torch or mindspore.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import repeat
from operator import add, eq

import numpy as np

from msprobe.core.compare.dtypes import dtypes_compatible, per_dtype_pair
from msprobe.core.compare.mappings import ApiRule, FusedRule
from msprobe.core.naming import BACKWARD, FORWARD, OPTIMIZER_PREFIX, api_key, module_key, module_parts, split_key

# MindSpore dump prefixes whose PyTorch counterparts only differ in the prefix (facts §8.8).
MS_PREFIX_TO_PT = {"Mint": "Torch", "MintFunctional": "Functional", "Cell": "Module",
                   "MintDistributed": "Distributed"}
_INDEXED_ROLE = re.compile(r"^\.(input|output)\.(\d+)(.*)$")
# match_rows' golden index for a target value with no counterpart by construction: it only exists inside
# one golden call (nn.Dense's MatMul output against F.linear), or only the target's API returns it
# (MindSpore BatchNorm's batch statistics). Unpaired, and not missing either.
INSIDE_FUSED = -2
INSIDE = ".inside"


@dataclass
class MatchOptions:
    """How to pair names. Built by the engine from the user's flags.

    Attributes:
        fuzzy: align call sequences ignoring call indices.
        renumber_backward: renumber backward call indices by occurrence (off for debug.json and fuzzy).
        cross_framework: target is MindSpore and golden PyTorch: apply prefix swaps and `api_rules`.
        api_rules: ms dump base name -> mappings.ApiRule; tuple of ms names -> mappings.FusedRule.
        cell_table: mappings.CellTable (Cell class and parameter names) for cross_framework.
        cell_mapping: module `path.Class` or substring, target -> golden.
        layer_mapping: `{LayerClass: {target child: golden child}}`.
        data_mapping: full tensor names, target -> golden (checked without dtype compatibility).
    """

    fuzzy: bool = False
    renumber_backward: bool = True
    cross_framework: bool = False
    api_rules: dict = field(default_factory=dict)
    cell_table: object = None
    cell_mapping: dict = field(default_factory=dict)
    layer_mapping: dict = field(default_factory=dict)
    data_mapping: dict = field(default_factory=dict)


def _rebuild(key, base, direction, index):
    """The key with a new base and index, in the key's own grammar (API or module)."""
    prefix, rest = base.split(".", 1) if "." in base else (base, "")
    if key.endswith(f".{direction}"):  # API: {prefix}.{api}.{n}.{direction}
        return api_key(prefix, rest, index, direction)
    path, _, cls = rest.rpartition(".")
    return module_key(prefix, path, cls, direction, index)


def renumbered_keys(keys, enabled=True):
    """key -> key with backward call indices renumbered 0, 1, ... per API/module in dump order."""
    out = {}
    counters = defaultdict(int)
    for key in keys:
        if not enabled or ".backward" not in key:
            out[key] = key
            continue
        base, direction, index = split_key(key)
        if direction == BACKWARD:
            n = counters[base]
            counters[base] = n + 1
            out[key] = _rebuild(key, base, direction, n)
        else:
            out[key] = key
    return out


class _KeyMapper:
    """Target record key -> the golden key it should pair with (before fuzzy alignment)."""

    def __init__(self, opts, target_keys):
        self.opts = opts
        self.layer_classes = self._module_classes(target_keys) if opts.layer_mapping else {}

    @staticmethod
    def _module_classes(keys):
        """module path -> class name, from the module keys of the dump."""
        classes = {}
        for key in keys:
            parts = module_parts(key)
            if parts is not None and parts[1]:
                classes.setdefault(parts[1], parts[2])
        return classes

    def rule_for(self, base):
        return self.opts.api_rules.get(base) if self.opts.cross_framework else None

    def map_base(self, base):
        opts = self.opts
        if base.startswith(_OPTIMIZER_DOT):
            return self._map_update(base)
        rule = self.rule_for(base)
        if rule is not None:
            base = rule.pt_api
        elif opts.cross_framework:
            prefix, dot, rest = base.partition(".")
            if prefix == "Cell" and opts.cell_table is not None and "." in rest:
                path, _, cls = rest.rpartition(".")
                rest = path + "." + opts.cell_table.classes.get(cls, cls)
            base = MS_PREFIX_TO_PT.get(prefix, prefix) + dot + rest
        prefix, dot, rest = base.partition(".")
        if prefix not in ("Module", "Cell") or not rest:
            return base
        if opts.layer_mapping:
            rest = self._map_layers(rest)
        if opts.cell_mapping:
            rest = self._map_cells(rest)
        return prefix + dot + rest

    def _map_update(self, base):
        """An optimizer update `Optimizer.{Class}.{module path}.{parameter}`: MindSpore's class and
        parameter names as PyTorch's, the module path through the layer mapping."""
        opts = self.opts
        cls, _, param = base[len(_OPTIMIZER_DOT):].partition(".")
        if opts.cross_framework and opts.cell_table is not None:
            cls, param = _optimizer_update_name(cls + "." + param, opts.cell_table).split(".", 1)
        if opts.layer_mapping and "." in param:
            param = self._map_layers(param)  # the parameter's name stands where a module's class would
        return _OPTIMIZER_DOT + cls + "." + param

    def _map_layers(self, path_cls):
        path, _, cls = path_cls.rpartition(".")
        if not path:
            return path_cls
        parts = path.split(".")
        mapped = []
        for i, part in enumerate(parts):
            parent_cls = "TopLayer" if i == 0 else self.layer_classes.get(".".join(parts[:i]))
            table = self.opts.layer_mapping.get(parent_cls) or {}
            if i == 0 and part not in table:
                table = {}
            mapped.append(table.get(part, part))
        return ".".join(mapped) + "." + cls

    def _map_cells(self, path_cls):
        cmap = self.opts.cell_mapping
        if path_cls in cmap:
            return cmap[path_cls]
        for src, dst in cmap.items():
            if src in path_cls:
                return path_cls.replace(src, dst, 1)
        return path_cls

    def golden_key(self, key):
        base, direction, index = split_key(key)
        if not direction or direction == "debug":
            return key
        new_base = self.map_base(base)
        return key if new_base == base else _rebuild(key, new_base, direction, index)


def _optimizer_update_name(rest, table):
    """`SGD.block.norm1.gamma` (an optimizer update record, core/dump/optimizer_updates.py) with
    PyTorch's optimizer class and parameter name: `SGD.block.norm1.weight`."""
    cls, _, param = rest.partition(".")
    head, dot, last = param.rpartition(".")
    return table.optimizers.get(cls, cls) + "." + head + dot + table.parameters.get(last, last)


def _strip_index(key):
    base, direction, _ = split_key(key)
    return f"{base}.{direction}" if direction else key


# fuzzy alignment: how far ahead to look for the place where the two call sequences agree again, and
# how many consecutive calls must agree there (one equal name is not enough: call patterns repeat)
FUZZY_WINDOW = 5000
FUZZY_RUN = 4
FUZZY_DIFFER = 16  # at most this many consecutive calls differing on both sides are bridged


def _positions(seq):
    where = defaultdict(list)
    for i, name in enumerate(seq):
        where[name].append(i)
    return where


def _next_agreement(seq, where, start, other, at, run_len=FUZZY_RUN):
    """Smallest k > 0 (within the window) where seq[start+k:] begins like other[at:] for `run_len` calls:
    -1 if none."""
    import bisect
    spots = where.get(other[at], ())
    run = other[at:at + run_len]
    for pos in spots[bisect.bisect_right(spots, start):]:
        k = pos - start
        if k > FUZZY_WINDOW:
            break
        if seq[pos:pos + len(run)] == run:
            return k
    return -1


def _realign_options(a, b, where_a, where_b, i, j, run):
    """(cost, kind, target calls to skip, golden calls to skip) of the ways back to `run` agreeing calls."""
    skip_a = _next_agreement(a, where_a, i, b, j, run)  # extra target calls before a[i + skip_a]
    skip_b = _next_agreement(b, where_b, j, a, i, run)  # extra golden calls
    # or a few calls differ on each side, not always as many (reshape + permute against transpose +
    # contiguous + view), and the sequences agree right after them (preferred on a tie: a periodic
    # pattern such as transformer layers also agrees after skipping one whole period)
    options = [(max(da, db), 0, da, db) for da, db in [_differing_run(a, b, i, j, run)] if da or db]
    return options + [(k, 1, k, 0) for k in (skip_a,) if k > 0] + [(k, 1, 0, k) for k in (skip_b,) if k > 0]


def _differing_run(a, b, i, j, run):
    """(da, db): the fewest calls to pass on each side (at most FUZZY_DIFFER, as few on the longer side
    as may be, equal counts first) after which `run` calls agree; (0, 0) if none."""
    for d in range(1, FUZZY_DIFFER + 1):
        for other in range(d, -1, -1):  # d calls on one side, d, d-1, ... 0 on the other
            for da, db in ((d, other), (other, d)):
                if i + da < len(a) and j + db < len(b) and a[i + da:i + da + run] == b[j + db:j + db + run]:
                    return da, db
    return 0, 0


def _align(target_keys, golden_keys):
    """target key -> golden key by aligning the two call sequences with call indices removed.

    Walks both sequences together; at a disagreement it takes the cheapest way back to FUZZY_RUN agreeing
    calls: skip extra calls on one side, or one differing call on each side (also the fallback when
    nothing agrees within the window). Linear in the dump size for dumps that mostly agree.
    """
    a = [_strip_index(k) for k in target_keys]
    b = [_strip_index(k) for k in golden_keys]
    where_a, where_b = _positions(a), _positions(b)
    pairs = {}
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            pairs[target_keys[i]] = golden_keys[j]
            i += 1
            j += 1
            continue
        # the cheapest way back to FUZZY_RUN agreeing calls; failing that, to fewer (two frameworks
        # differ every few calls: an extra cast here, a reshape against a flatten there)
        options = _realign_options(a, b, where_a, where_b, i, j, FUZZY_RUN)
        # or one extra call right here (a cast beside another difference), before differing calls
        options += [(1, 2, 1, 0)] if i + 1 < len(a) and a[i + 1] == b[j] else (
            [(1, 2, 0, 1)] if j + 1 < len(b) and a[i] == b[j + 1] else [])
        for run in range(FUZZY_RUN - 1, 1, -1):
            if options:
                break
            options = _realign_options(a, b, where_a, where_b, i, j, run)
        # on a tie the option after which both sides have as many calls left: in a run of one repeated call
        # (an optimizer's add_ per parameter) an extra call and a differing pair agree again alike
        left = len(a) - i - (len(b) - j)
        _, _, di, dj = min(options, key=lambda o: (o[0], abs(left - o[2] + o[3]), o[1:])) if options else (0, 0, 1, 1)
        i += di
        j += dj
    return pairs


_GRAD_DIRECTIONS = (BACKWARD, "parameters_grad")
_OPTIMIZER_DOT = OPTIMIZER_PREFIX + "."


def _forward_of(key):
    """The forward key of a backward or parameters_grad key (same call index), else None."""
    base, direction, index = split_key(key)
    if direction not in _GRAD_DIRECTIONS:
        return None
    if key.endswith("." + BACKWARD):
        return f"{base}.{index}.{FORWARD}"
    return f"{base}.{FORWARD}.{index}"


def _grad_of(forward_key, direction):
    """The backward (or parameters_grad) key of a forward key, in its grammar."""
    base, _, index = split_key(forward_key)
    if forward_key.endswith("." + FORWARD):
        return f"{base}.{index}.{direction}" if direction == BACKWARD else None
    return f"{base}.{direction}.{index}"


def _fuzzy_pairs(target_keys, golden_keys):
    """target key -> golden key, forward calls by aligning the two forward call sequences (`_align`);
    a backward or parameters_grad record follows its forward call's partner (the order of a backward
    pass differs between frameworks and runs even when the calls agree); the ones without a paired
    forward call are aligned among themselves."""
    golden = set(golden_keys)
    # an optimizer update names its parameter: it pairs by name, in whatever order the groups list them
    by_name = {k for k in target_keys if k.startswith(_OPTIMIZER_DOT)}
    fwd_t = [k for k in target_keys if _forward_of(k) is None and k not in by_name]
    fwd_g = [k for k in golden_keys if _forward_of(k) is None and not k.startswith(_OPTIMIZER_DOT)]
    pairs = _align(fwd_t, fwd_g)
    pairs.update((k, k) for k in by_name if k in golden)
    rest = []
    for k in target_keys:
        forward = _forward_of(k)
        if forward is None:
            continue
        partner = pairs.get(forward)
        wanted = _grad_of(partner, split_key(k)[1]) if partner is not None else None
        if wanted in golden:
            pairs[k] = wanted
        else:
            rest.append(k)
    if rest:
        used = set(pairs.values())
        pairs.update(_align(rest, [k for k in golden_keys if _forward_of(k) is not None and k not in used]))
    return pairs


def differing_call_counts(target_keys, golden_keys):
    """(name, target count, golden count) of the first API or module called a different number of times
    by the two runs (among those both call), or None. Then index i of a name is not the same call on
    both sides (another attention implementation builds its mask with more slicing): pair by alignment."""
    from collections import Counter
    t_keys, g_keys = dict.fromkeys(target_keys), dict.fromkeys(golden_keys)
    if t_keys.keys() == g_keys.keys():  # the same calls (the usual case): every count agrees
        return None
    t = Counter(_strip_index(k) for k in t_keys)
    g = Counter(_strip_index(k) for k in g_keys)
    for name, n in t.items():
        if name in g and g[name] != n:
            return name, n, g[name]
    return None


def _map_suffix(suffix, rule, direction):
    """A target row's suffix as PyTorch names it: inputs by `args`, outputs by `outputs`; in a backward
    record the roles swap (its inputs are the gradients of the forward outputs)."""
    m = _INDEXED_ROLE.match(suffix)
    if not m:
        return suffix
    role, idx, rest = m.group(1), int(m.group(2)), m.group(3)
    own_output = (role == "output") != (direction == BACKWARD)  # an output, or its gradient
    if own_output and rule.outputs and idx not in rule.outputs:
        return INSIDE + suffix  # an output only MindSpore's call returns
    if direction == BACKWARD:
        if role == "output":
            to = rule.grads.get(idx, rule.args.get(idx, idx))
            to = to if isinstance(to, int) else idx
        else:
            to = rule.outputs.get(idx, idx)
    else:
        to = (rule.args if role == "input" else rule.outputs).get(idx, idx)
    return f".{role}.{to}{rest}"


class _FusedMember:
    """A target call that makes one PyTorch call together with its neighbours (mappings.FusedRule):
    its rows' suffixes as the PyTorch call names them; a row with no counterpart (a value that only
    exists inside the PyTorch call) gets a suffix nothing pairs with."""

    __slots__ = ("forward", "backward")

    def __init__(self, rule, member):
        self.forward, self.backward = {}, {}
        for role, table in (("input", rule.inputs), ("output", rule.outputs)):
            grad_role = "output" if role == "input" else "input"
            for pt_pos, (call, ms_pos) in table.items():
                if call == member:
                    self.forward[(role, ms_pos)] = f".{role}.{pt_pos}"
                    if isinstance(pt_pos, int) and not (role == "input" and rule.grads):
                        self.backward[(grad_role, ms_pos)] = f".{grad_role}.{pt_pos}"
        for pt_pos, (call, ms_pos) in (rule.grads or {}).items():
            if call == member:
                self.backward[("output", ms_pos)] = f".output.{pt_pos}"

    def suffix(self, suffix, direction):
        m = _INDEXED_ROLE.match(suffix)
        if not m:
            return suffix
        table = self.backward if direction == BACKWARD else self.forward
        to = table.get((m.group(1), int(m.group(2))))
        return INSIDE + suffix if to is None else to + m.group(3)


def _fused_calls(t_keys, fused_rules):
    """target key -> (golden base, group number, _FusedMember) for the forward calls that make one
    PyTorch call together (consecutive API calls, longest rule first) and for their backward calls."""
    if not fused_rules:
        return {}
    rules = sorted(fused_rules, key=lambda r: -len(r.ms_calls))
    fwd = [(k, split_key(k)) for k in t_keys]
    fwd = [(k, base, index) for k, (base, direction, index) in fwd
           if direction == FORWARD and not base.startswith("Cell.")]
    bases = [b for _, b, _ in fwd]
    out, by_origin, group, i = {}, {}, 0, 0
    while i < len(fwd):
        rule = next((r for r in rules if tuple(bases[i:i + len(r.ms_calls)]) == r.ms_calls), None)
        if rule is None:
            i += 1
            continue
        for member in range(len(rule.ms_calls)):
            key, base, index = fwd[i + member]
            entry = (rule.pt_api, group, _FusedMember(rule, member))
            out[key] = entry
            by_origin[(base, index)] = entry
        group += 1
        i += len(rule.ms_calls)
    for k in t_keys:
        base, direction, index = split_key(k)
        if direction == BACKWARD and (base, index) in by_origin:
            out[k] = by_origin[(base, index)]
    return out


def _renumber_apis(t_keys, mapped, fused):
    """Cross-framework: the mapped API keys numbered 0, 1, ... per golden API in forward call order (a
    fused group shares one number; a backward call takes its forward call's), so that two MindSpore
    calls that became one PyTorch name (`ops.dense` and nn.Dense's MatMul) do not collide."""
    counters = defaultdict(int)
    numbers = {}  # (target base, target index) or fused group -> new index
    out = dict(mapped)
    for k in t_keys:
        new = mapped[k]
        base, direction, index = split_key(new)
        if direction != FORWARD or not new.endswith(FORWARD):  # modules keep their numbers
            continue
        t_base, _, t_index = split_key(k)
        origin = ("fused", fused[k][1]) if k in fused else (t_base, t_index)
        if origin not in numbers:
            numbers[origin] = counters[base]
            counters[base] += 1
        numbers[(t_base, t_index)] = numbers[origin]
        out[k] = _rebuild(new, base, direction, numbers[origin])
    for k in t_keys:
        new = mapped[k]
        base, direction, _ = split_key(new)
        t_base, _, t_index = split_key(k)
        if direction == BACKWARD and new.endswith(BACKWARD) and (t_base, t_index) in numbers:
            out[k] = _rebuild(new, base, direction, numbers[(t_base, t_index)])
    return out


def _map_parameter_suffix(suffix, names):
    """`.parameters.gamma` / `.gamma` (parameters_grad) with MindSpore's parameter name as PyTorch's."""
    head, dot, last = suffix.rpartition(".")
    return head + dot + names[last] if last in names else suffix


def _joined(keys, suffixes):
    """key + suffix per row; None where the key is None (a target call fuzzy matching left unpaired)."""
    keys = list(keys)
    try:
        return list(map(add, keys, suffixes))
    except TypeError:
        return [None if k is None else k + s for k, s in zip(keys, suffixes)]


def _unchanged(key_map):
    """Whether a key -> key mapping maps every key to itself."""
    return all(map(eq, key_map, key_map.values()))


def _first_positions(names):
    """name -> index of its first occurrence."""
    return dict(zip(reversed(names), range(len(names) - 1, -1, -1)))


def _suffix_mappers(t_keys, mapper, fused, cell_table):
    """target key -> function giving a row suffix as the golden record names it, for the keys that
    need one: API rules that reorder arguments, fused calls, Cells with MindSpore parameter names."""
    out = {}
    params = cell_table.parameters if cell_table is not None else {}
    keywords = cell_table.keywords if cell_table is not None else {}
    for k in t_keys:
        base, direction, _ = split_key(k)
        if k in fused:
            member = fused[k][2]
            out[k] = lambda s, m=member, d=direction: m.suffix(s, d)
            continue
        rule = mapper.rule_for(base)
        if isinstance(rule, ApiRule) and (rule.args or rule.outputs or rule.grads):
            out[k] = lambda s, r=rule, d=direction: _map_keyword(_map_suffix(s, r, d), keywords)
        elif params and base.startswith("Cell."):
            out[k] = lambda s: _map_parameter_suffix(s, params)
        elif keywords and direction == FORWARD:
            out[k] = lambda s: _map_keyword(s, keywords)
    return out


def _map_keyword(suffix, names):
    """`.input.axis` as PyTorch names the keyword (`.input.dim`)."""
    if not suffix.startswith(".input.") or suffix[7:8].isdigit():
        return suffix
    name, dot, rest = suffix[7:].partition(".")
    return ".input." + names.get(name, name) + dot + rest


def match_rows(target, golden, opts):
    """Golden row index for every target row, -1 where nothing pairs.

    Args:
        target, golden: row tables (pandas.DataFrame with the columns of `rows.COLUMNS`).
        opts: MatchOptions.

    Returns:
        numpy int64 array, one entry per target row: -1 where nothing pairs, INSIDE_FUSED (-2) for a
        value inside what the golden run makes as one call (nn.Dense's MatMul output against F.linear).
    """
    t_key_list, g_key_list = target["key"].tolist(), golden["key"].tolist()
    t_keys = list(dict.fromkeys(t_key_list))
    g_keys = list(dict.fromkeys(g_key_list))
    renumber = opts.renumber_backward and not opts.fuzzy
    g_renum = renumbered_keys(g_keys, renumber)
    t_renum = renumbered_keys(t_keys, renumber)
    mapper = _KeyMapper(opts, t_keys)
    fused = {}
    if opts.cross_framework or opts.cell_mapping or opts.layer_mapping:
        mapped = {k: mapper.golden_key(t_renum[k]) for k in t_keys}
        if opts.cross_framework:
            fused = _fused_calls(t_keys, [r for r in opts.api_rules.values() if isinstance(r, FusedRule)])
            for k, (pt_api, _, _) in fused.items():
                base, direction, index = split_key(k)
                mapped[k] = api_key(*pt_api.split(".", 1), index, direction)
            mapped = _renumber_apis(t_keys, mapped, fused)
    else:
        mapped = t_renum
    g_suffix = golden["suffix"].tolist()
    if opts.fuzzy:
        renum_to_golden = _fuzzy_pairs(list(dict.fromkeys(mapped[k] for k in t_keys)), g_keys)
        mapped = {k: renum_to_golden.get(mapped[k]) for k in t_keys}
        golden_match = _joined(g_key_list, g_suffix)
    else:
        golden_match = (golden["name"].tolist() if _unchanged(g_renum) else
                        _joined(map(g_renum.__getitem__, g_key_list), g_suffix))

    suffix = target["suffix"]
    if opts.cross_framework:
        suffix_of = _suffix_mappers(t_keys, mapper, fused, opts.cell_table)
        if suffix_of:
            sel = target["key"].isin(suffix_of.keys())
            suffix = suffix.copy()
            suffix[sel] = [suffix_of[k](s) for s, k in zip(target["suffix"][sel], target["key"][sel])]
    if suffix is target["suffix"] and _unchanged(mapped):
        match = target["name"].tolist()  # key + suffix already
    else:
        match = _joined(map(mapped.__getitem__, t_key_list), suffix.tolist())

    # plain dicts and C-level maps: pandas' map/index lookups pay per element in Python
    position = _first_positions(golden_match)
    gidx = np.fromiter(map(position.get, match, repeat(-1)), dtype=np.int64, count=len(match))
    explicit = np.zeros(len(target), dtype=bool)
    if opts.data_mapping:
        by_name = _first_positions(golden["name"].tolist())
        for i, name in enumerate(target["name"].tolist()):
            wanted = opts.data_mapping.get(name)
            if wanted is not None and wanted == wanted:
                gidx[i] = by_name.get(wanted, -1)
                explicit[i] = True

    # undo pairs of rows that cannot belong together (an int index paired with a float activation)
    paired = (gidx >= 0) & ~explicit
    if paired.any():
        t_dt = target["dtype"].to_numpy()[paired]
        g_dt = golden["dtype"].to_numpy()[gidx[paired]]
        ok = per_dtype_pair(t_dt, g_dt, lambda a, b: a == b or dtypes_compatible(a, b))
        idx = np.flatnonzero(paired)
        gidx[idx[~ok]] = -1
    if opts.cross_framework:  # values inside one PyTorch call (nn.Dense's MatMul output): no counterpart
        gidx[(gidx < 0) & suffix.str.startswith(INSIDE).to_numpy()] = INSIDE_FUSED
    return gidx
