"""Name mappings between two dumps: the user's YAML files (-dm, -cm, -am, -lm) and the built-in
MindSpore -> PyTorch API table (`data/ms_to_pt_api.yaml`). Loading and validation only; applying them
to names is `matching.py`'s job. Must not import torch or mindspore.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from msprobe.core.errors import DumpFormatError, MsprobeError
from msprobe.core.file_limits import read_bytes

_BUILTIN_API_TABLE = os.path.join(os.path.dirname(__file__), "data", "ms_to_pt_api.yaml")
_BUILTIN_CELL_TABLE = os.path.join(os.path.dirname(__file__), "data", "ms_to_pt_cells.yaml")
_API_ENTRY_KEYS = {"ms_api", "pt_api", "ms_args", "pt_args", "ms_outputs", "pt_outputs", "ms_grads", "pt_grads",
                   "ms_parameters", "pt_parameters", "ms_parameters_grad", "pt_parameters_grad"}
_FUSED_ENTRY_KEYS = {"ms_calls", "pt_api", "inputs", "outputs", "grads"}


def load_yaml(path, what):
    """The parsed YAML of a mapping file; a clear one-line error for a missing or malformed file."""
    import yaml
    if not os.path.lexists(path):
        raise MsprobeError(f"{what} '{path}': file not found")
    try:
        return yaml.safe_load(read_bytes(path).decode("utf-8"))
    except DumpFormatError as e:
        raise MsprobeError(f"{what}: {e}") from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as e:
        detail = " ".join(str(e).split())
        raise MsprobeError(f"{what} '{path}': not valid YAML ({detail})") from None


@dataclass(frozen=True)
class ApiRule:
    """One MindSpore API and its PyTorch counterpart; `args`/`outputs` map ms index -> pt index (or a
    PyTorch keyword name), `grads` ms input index -> position of its gradient in PyTorch's backward record
    (defaults to `args` where that is a position)."""

    ms_api: str
    pt_api: str
    args: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    grads: dict = field(default_factory=dict)


@dataclass(frozen=True)
class FusedRule:
    """One PyTorch call a MindSpore Cell makes as consecutive calls `ms_calls` (nn.Dense: MatMul then
    BiasAdd for F.linear). `inputs`/`outputs`: PyTorch position -> (index in ms_calls, ms position);
    `grads`: position in PyTorch's backward output (its tensor arguments only) -> (call, ms input), when
    that is not the input's position (F.layer_norm's normalized_shape takes no slot)."""

    ms_calls: tuple
    pt_api: str
    inputs: dict
    outputs: dict
    grads: dict = None


def _index_map(entry, ms_field, pt_field, path, names=False):
    ms, pt = entry.get(ms_field), entry.get(pt_field)
    if ms is None and pt is None:
        return {}
    pt_ok = (str, int) if names else int
    if not (isinstance(ms, list) and isinstance(pt, list) and len(ms) == len(pt)
            and all(isinstance(i, int) for i in ms) and all(isinstance(i, pt_ok) for i in pt)):
        allowed = "integers (pt side: integers or keyword names)" if names else "integers"
        raise MsprobeError(f"api mapping '{path}': entry {entry.get('ms_api')!r}: {ms_field} and {pt_field} "
                           f"must be equally long lists of {allowed}; got {ms!r} and {pt!r}")
    return dict(zip(ms, pt))


def _fused_rule(entry, path):
    calls = entry.get("ms_calls")
    name = entry.get("pt_api")
    if not (isinstance(calls, list) and len(calls) >= 2 and all(isinstance(c, str) for c in calls)
            and isinstance(name, str)):
        raise MsprobeError(f"api mapping '{path}': entry {entry!r} needs ms_calls (a list of two or more API "
                           "names) and pt_api (a string)")
    unknown = set(entry) - _FUSED_ENTRY_KEYS
    if unknown:
        raise MsprobeError(f"api mapping '{path}': entry {calls!r} has unknown field(s) "
                           f"{', '.join(sorted(unknown))}; allowed: {', '.join(sorted(_FUSED_ENTRY_KEYS))}")
    out = {}
    for what in ("inputs", "outputs", "grads"):
        table = entry.get(what) or {}
        ok = isinstance(table, dict) and all(
            isinstance(v, list) and len(v) == 2 and all(isinstance(i, int) for i in v) and 0 <= v[0] < len(calls)
            for v in table.values())
        if not ok:
            raise MsprobeError(f"api mapping '{path}': entry {calls!r}: {what} must map a PyTorch position to "
                               f"[call index below {len(calls)}, position]; got {table!r}")
        out[what] = {k: tuple(v) for k, v in table.items()}
    return FusedRule(tuple(calls), name, out["inputs"], out["outputs"], out["grads"] or None)


def _api_rules_from(doc, path):
    if doc is None:
        return {}
    if isinstance(doc, dict):  # short form `ms_api: pt_api`
        doc = [{"ms_api": k, "pt_api": v} for k, v in doc.items()]
    if not isinstance(doc, list):
        raise MsprobeError(f"api mapping '{path}': expected a list of {{ms_api, pt_api, ...}} entries, "
                           f"got {type(doc).__name__}")
    rules = {}
    for entry in doc:
        if isinstance(entry, dict) and "ms_calls" in entry:
            rules[tuple(entry.get("ms_calls") or ())] = _fused_rule(entry, path)
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("ms_api"), str) \
                or not isinstance(entry.get("pt_api"), str):
            raise MsprobeError(f"api mapping '{path}': entry {entry!r} needs string fields ms_api and pt_api")
        unknown = set(entry) - _API_ENTRY_KEYS
        if unknown:
            raise MsprobeError(f"api mapping '{path}': entry {entry['ms_api']!r} has unknown field(s) "
                               f"{', '.join(sorted(unknown))}; allowed: {', '.join(sorted(_API_ENTRY_KEYS))}")
        rules[entry["ms_api"]] = ApiRule(entry["ms_api"], entry["pt_api"],
                                         _index_map(entry, "ms_args", "pt_args", path, names=True),
                                         _index_map(entry, "ms_outputs", "pt_outputs", path),
                                         _index_map(entry, "ms_grads", "pt_grads", path))
    return rules


def load_api_mapping(path=None):
    """The built-in MindSpore -> PyTorch table, updated with the user's file when `path` is given.

    Returns:
        dict: ms dump name without call index (`Functional.gather`) -> ApiRule, and the tuple of
        `ms_calls` -> FusedRule for a PyTorch call MindSpore makes as several.
    """
    rules = _api_rules_from(load_yaml(_BUILTIN_API_TABLE, "built-in api mapping"), _BUILTIN_API_TABLE)
    if path:
        rules.update(_api_rules_from(load_yaml(path, "api mapping"), path))
    return rules


@dataclass(frozen=True)
class CellTable:
    """MindSpore Cell class -> PyTorch Module class, MindSpore parameter name -> PyTorch's, MindSpore
    keyword argument name -> PyTorch's, MindSpore optimizer class -> PyTorch's."""

    classes: dict
    parameters: dict
    keywords: dict
    optimizers: dict = field(default_factory=dict)


def load_cell_table():
    """The built-in MindSpore -> PyTorch Cell and parameter names (`data/ms_to_pt_cells.yaml`)."""
    doc = load_yaml(_BUILTIN_CELL_TABLE, "built-in cell table") or {}
    return CellTable(_flat_str_map(doc.get("classes"), _BUILTIN_CELL_TABLE, "built-in cell table"),
                     _flat_str_map(doc.get("parameters"), _BUILTIN_CELL_TABLE, "built-in cell table"),
                     _flat_str_map(doc.get("keywords"), _BUILTIN_CELL_TABLE, "built-in cell table"),
                     _flat_str_map(doc.get("optimizers"), _BUILTIN_CELL_TABLE, "built-in cell table"))


def _flat_str_map(doc, path, what):
    if doc is None:
        return {}
    if not isinstance(doc, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in doc.items()):
        raise MsprobeError(f"{what} '{path}': expected 'target name: golden name' string pairs")
    return dict(doc)


def load_data_mapping(path):
    """Full tensor names, target -> golden (`Functional.linear.0.forward.input.0: ...`)."""
    return _flat_str_map(load_yaml(path, "data mapping"), path, "data mapping")


def load_cell_mapping(path):
    """Module path/class pairs or substrings, target -> golden (`fc1.Linear: body.0.Linear`)."""
    return _flat_str_map(load_yaml(path, "cell mapping"), path, "cell mapping")


def load_layer_mapping(path):
    """`{LayerClass: {target child name: golden child name}}`; `TopLayer` holds the root's children."""
    doc = load_yaml(path, "layer mapping")
    if doc is None:
        return {}
    ok = isinstance(doc, dict) and all(
        isinstance(v, dict) and all(isinstance(a, str) and isinstance(b, str) for a, b in v.items())
        for v in doc.values() if v is not None)
    if not ok:
        raise MsprobeError(f"layer mapping '{path}': expected 'LayerClass: {{target child: golden child}}' "
                           "entries with string names")
    return {str(k): dict(v or {}) for k, v in doc.items()}
