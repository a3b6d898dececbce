"""DumpReader: read one rank directory (ours or msProbe's) and find rank directories in a dump tree.

Queryable like a dict: exact key, integer index, or unique substring; an ambiguous query lists the
candidates, a miss suggests the nearest keys. Must not import torch or mindspore.
"""

import difflib
import os
import re
from dataclasses import dataclass

from msprobe.core.errors import DumpFormatError, MsprobeError
from msprobe.core.file_limits import load_json  # noqa: F401 (the one JSON reader; imported from here too)

_STEP_RE = re.compile(r"^step(\d+)$")
_RANK_RE = re.compile(r"^(rank|proc)(\d+)$")
_NONFINITE = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan"),
              "Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def stat_value(v):
    """A statistic as float/int/None: accepts our "inf"/"nan" strings and msProbe's bare tokens."""
    if isinstance(v, str):
        return _NONFINITE.get(v, v)
    return v


def load_stack(path):
    """key -> list of stack lines of a stack.json: ours and msProbe's `{"0": [[key, ...], [line, ...]]}`,
    older msProbe's `{key: [line, ...]}`.

    Raises:
        DumpFormatError: not a JSON object of those entries.
    """
    doc = load_json(path)
    if not isinstance(doc, dict):
        raise DumpFormatError(f"{path}: expected a JSON object (stack id -> [keys, lines]), got {type(doc).__name__}")
    stacks = {}
    for name, entry in doc.items():
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list):
            keys, lines = entry
            keys = keys if isinstance(keys, list) else [keys]
        else:
            keys, lines = [name], entry
        if not isinstance(lines, list):
            raise DumpFormatError(f"{path}: entry {name!r} is not a list of stack lines")
        lines = [str(line) for line in lines]
        for k in keys:
            if isinstance(k, str):
                stacks[k] = lines
    return stacks


@dataclass(frozen=True)
class RankDir:
    """One `step{N}/rank{R}` (or `proc{pid}`) directory of a dump tree."""

    path: str
    step: int
    rank: int
    is_proc: bool


def find_rank_dirs(root):
    """All rank directories under `root`, which may be a dump root, a step dir or a rank dir.

    Returns:
        list[RankDir] sorted by (step, rank).

    Raises:
        MsprobeError: nothing dump-like was found.
    """
    root = os.path.abspath(root)
    if os.path.isfile(root):
        root = os.path.dirname(root)
    if _has_dump_file(root):
        step_m = _STEP_RE.match(os.path.basename(os.path.dirname(root)))
        rank_m = _RANK_RE.match(os.path.basename(root))
        return [RankDir(root, int(step_m.group(1)) if step_m else 0,
                        int(rank_m.group(2)) if rank_m else 0, bool(rank_m and rank_m.group(1) == "proc"))]
    found = []
    if not os.path.isdir(root):
        step_dirs = []
    elif _STEP_RE.match(os.path.basename(root)):
        step_dirs = [root]
    else:
        step_dirs = [os.path.join(root, d) for d in os.listdir(root)
                     if _STEP_RE.match(d) and os.path.isdir(os.path.join(root, d))]
    for sd in step_dirs:
        step = int(_STEP_RE.match(os.path.basename(sd)).group(1))
        for d in os.listdir(sd):
            m = _RANK_RE.match(d)
            if m and _has_dump_file(os.path.join(sd, d)):
                found.append(RankDir(os.path.join(sd, d), step, int(m.group(2)), m.group(1) == "proc"))
    if not found:
        raise MsprobeError(f"'{root}': no dump found; expected step{{N}}/rank{{R}}/dump.json below it")
    return sorted(found, key=lambda r: (r.step, r.is_proc, r.rank))


def _has_dump_file(d):
    return os.path.isfile(os.path.join(d, "dump.json")) or os.path.isfile(os.path.join(d, "debug.json"))


class DumpReader:
    """Read one rank directory or one dump.json/debug.json file.

    Args:
        path: a rank directory or the path of its dump.json / debug.json.

    Example:
        >>> r = DumpReader("dump_path/step0/rank0")            # doctest: +SKIP
        >>> r["linear.0.forward"]["output"][0]["Max"]          # doctest: +SKIP
    """

    def __init__(self, path):
        if os.path.isdir(path):
            name = "dump.json" if os.path.isfile(os.path.join(path, "dump.json")) else "debug.json"
            self.rank_dir, self.dump_file = path, os.path.join(path, name)
        else:
            self.rank_dir, self.dump_file = os.path.dirname(path) or ".", path
        doc = load_json(self.dump_file)
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
            raise DumpFormatError(f"{self.dump_file}: expected an object with a 'data' object")
        self.task = doc.get("task")
        self.level = doc.get("level")
        self.framework = doc.get("framework")
        self.dump_data_dir = doc.get("dump_data_dir")
        self.data = doc["data"]
        self._keys = list(self.data)
        self._stack = None
        self._construct = None

    def __len__(self):
        return len(self._keys)

    def __iter__(self):
        return iter(self._keys)

    def keys(self):
        return list(self._keys)

    def items(self):
        return self.data.items()

    def __contains__(self, key):
        return key in self.data

    def resolve(self, query):
        """The full key for an exact key, an integer index or a unique substring."""
        if isinstance(query, int):
            return self._keys[query]
        if query in self.data:
            return query
        hits = [k for k in self._keys if query in k]
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise KeyError(f"'{query}' matches {len(hits)} keys: {', '.join(hits[:10])}")
        near = difflib.get_close_matches(query, self._keys, n=3, cutoff=0.4)
        raise KeyError(f"'{query}' not in {self.dump_file}" + (f"; nearest: {', '.join(near)}" if near else ""))

    def __getitem__(self, query):
        return self.data[self.resolve(query)]

    @property
    def stack(self):
        """key -> list of stack lines (empty when stack.json is absent)."""
        if self._stack is None:
            path = os.path.join(self.rank_dir, "stack.json")
            self._stack = load_stack(path) if os.path.lexists(path) else {}
        return self._stack

    @property
    def construct(self):
        """node key -> parent module key or None (empty at L1 or when construct.json is absent)."""
        if self._construct is None:
            path = os.path.join(self.rank_dir, "construct.json")
            doc = load_json(path) if os.path.lexists(path) else {}
            if not isinstance(doc, dict) or not all(v is None or isinstance(v, str) for v in doc.values()):
                raise DumpFormatError(f"{path}: expected a JSON object (node -> parent module name or null)")
            self._construct = doc
        return self._construct

    def tensor_path(self, data_name):
        if not isinstance(data_name, str) or os.path.basename(data_name) != data_name or data_name in ("", ".", ".."):
            raise DumpFormatError(f"{self.dump_file}: data_name {data_name!r} is not a file name in the tensor folder")
        base = self.dump_data_dir if self.dump_data_dir and os.path.isdir(self.dump_data_dir) else \
            os.path.join(self.rank_dir, "dump_tensor_data")
        return os.path.join(base, data_name)

    def load_tensor(self, record):
        """The saved tensor of a tensor record (needs `data_name`), as a LoadedTensor."""
        from msprobe.core.dump.tensor_files import load_tensor_file
        name = record.get("data_name") if isinstance(record, dict) else None
        if not name:
            raise DumpFormatError(f"{self.dump_file}: record has no data_name (not a tensor dump?)")
        return load_tensor_file(self.tensor_path(name))


def iter_tensor_records(value, path=()):
    """Yield (index_path, record) for every tensor record in a nested args/output structure."""
    if isinstance(value, dict):
        if "type" in value and "dtype" in value and "shape" in value:
            yield path, value
            return
        for k, v in value.items():
            yield from iter_tensor_records(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from iter_tensor_records(v, path + (i,))
