"""`api_sources.json`, a file of our own beside dump.json: what acc_check needs to run a recorded API
again that the API's name alone does not say.

- `custom_apis`: where each API registered with `register_custom_api(module, "fn", "Prefix")` lives,
  `{"Prefix.fn": {"module": "pkg.mod", "attribute": "fn"}}` (plus `"qualname"` when it was
  registered on a class), so acc_check finds it without `--custom_api`.
- `primitives` (MindSpore): the constructor arguments of each Primitive instance a Cell held,
  `{"Primitive.conv2d.Conv2D": {"instances": [{"class": "mindspore.ops...Conv2D", "init": {...}}],
  "calls": [0, 1]}}`: call n of that dump name (`Primitive.conv2d.Conv2D.{n}.forward`) ran
  instance `calls[n]` (two Conv2d Cells share the name and differ in channels and strides).

msProbe reads dump.json, stack.json and construct.json by name and ignores other files, so a dump that
carries this file stays readable by msProbe; a dump without it (older, or msProbe's own) is checked as
before, its Primitives and custom APIs skipped with the reason. The file is written once per step,
when the step's session closes. Must not import torch or mindspore.
"""

import os

import orjson

from msprobe.core.errors import DumpFormatError
from msprobe.core.file_limits import load_json

FILE_NAME = "api_sources.json"


class ApiSources:
    """Collects one step's API sources while it is recorded; `write(rank_dir)` puts them on disk.

    The adapter notes `custom_api(...)` for every registered API and `primitive_called(...)` for every
    recorded Primitive call, in call order.
    """

    def __init__(self):
        self.custom_apis = {}
        self._primitives = {}   # dump name -> {"instances": [...], "calls": [...]}
        self._instance = {}     # (dump name, id of the primitive) -> index in its "instances"
        self._described = {}    # (dump name, instance JSON) -> its index: equal instances are listed once
        self._keep = []         # the primitives seen: their ids stay unique while this step is collected

    def custom_api(self, prefix, api, where):
        """`where`: {"module": ..., ["qualname": ...]} (see `source_of`)."""
        self.custom_apis[f"{prefix}.{api}"] = dict(where, attribute=api)

    def primitive_called(self, name, prim, describe):
        """Call number len(calls) of dump name `name` ran `prim`; `describe(prim)` gives its JSON entry
        (called once per instance)."""
        entry = self._primitives.setdefault(name, {"instances": [], "calls": []})
        key = (name, id(prim))
        index = self._instance.get(key)
        if index is None:
            described = describe(prim)
            text = (name, orjson.dumps(described, option=orjson.OPT_SORT_KEYS))
            index = self._described.get(text)
            if index is None:
                index = self._described[text] = len(entry["instances"])
                entry["instances"].append(described)
            self._instance[key] = index
            self._keep.append(prim)
        entry["calls"].append(index)

    def write(self, rank_dir):
        """Write `rank_dir/api_sources.json` (nothing when there is nothing to say). Returns its path or None."""
        return write_api_sources(rank_dir, {"custom_apis": self.custom_apis, "primitives": self._primitives})


def write_api_sources(rank_dir, doc):
    """Write `doc` ({"custom_apis": ..., "primitives": ...}) as `rank_dir/api_sources.json`, atomically;
    nothing when both are empty or the directory does not exist. Returns the path or None."""
    if not (doc.get("custom_apis") or doc.get("primitives")) or not os.path.isdir(rank_dir):
        return None
    path = os.path.join(rank_dir, FILE_NAME)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:  # orjson: json's indenting encoder leaves reference cycles behind
        f.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    os.replace(tmp, path)
    return path


def api_sources_of_case(doc, prefix, api):
    """The part of an api_sources document about the API `{prefix}.{api}` (a one-API dump's file)."""
    name = f"{prefix}.{api}"
    return {"custom_apis": {k: v for k, v in doc["custom_apis"].items() if k == name},
            "primitives": {k: v for k, v in doc["primitives"].items() if k == name}}


def source_of(owner):
    """Where `register_custom_api(owner, ...)` can find `owner` again: {"module": name} for a module,
    {"module": ..., "qualname": ...} for a class, {} for anything else (an instance: not findable)."""
    if isinstance(owner, type):
        return {"module": owner.__module__, "qualname": owner.__qualname__}
    name = getattr(owner, "__name__", None)
    if isinstance(name, str) and type(owner).__name__ == "module":
        return {"module": name}
    return {}


def read_api_sources(path):
    """An api_sources.json (or None) as a dict with `custom_apis` and `primitives`, both empty when
    there is no file.

    Raises:
        DumpFormatError: the file is not a JSON object.
    """
    doc = {}
    if path is not None and os.path.lexists(path):
        doc = load_json(path)
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k) or {}, dict) for k in ("custom_apis", "primitives")):
            raise DumpFormatError(f"{path}: expected a JSON object with custom_apis and primitives objects")
    return {"custom_apis": doc.get("custom_apis") or {}, "primitives": doc.get("primitives") or {}}


def api_sources_path(rank_dir):
    """Where a rank dir's api_sources.json is, or None when it has none."""
    path = os.path.join(rank_dir, FILE_NAME)
    return path if os.path.lexists(path) else None


class StepApiSources:
    """Mixin of both adapters' PrecisionDebugger, listed before DumpLifecycle: each step's session gets
    a fresh `ApiSources` (`_begin_api_sources`, called by the adapter's `_new_session`) holding every
    registered custom API, and the file is written beside the step's dump.json when the session closes."""

    _api_sources = None

    def _begin_api_sources(self):
        self._api_sources = ApiSources()
        for (_, api), (owner, prefix) in self._custom.items():
            self._api_sources.custom_api(prefix, api, source_of(owner))
        return self._api_sources

    def _note_custom_api(self, owner, api, prefix):
        """register_custom_api during a step: the step's file names it too."""
        if self._api_sources is not None:
            self._api_sources.custom_api(prefix, api, source_of(owner))

    def _close_session(self):
        session, sources = self._session, self._api_sources
        super()._close_session()
        self._api_sources = None
        writer = getattr(session, "writer", None)
        if sources is not None and writer is not None:
            sources.write(writer.rank_dir)
