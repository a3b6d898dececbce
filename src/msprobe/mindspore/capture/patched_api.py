"""L1 capture by wrapping: MindSpore has no function-mode hook at the API level (MsDispatchMode sees
kernels such as "Add", not `Tensor.__add__` or `mint.add`), so each API attribute is replaced by a
thin wrapper. The wrapper reads two globals and otherwise calls straight through; it records only
between start() and stop() (`_state.recording`), and calls made inside a recorded API are not
recorded again.

The ~1,500 wrappers of the API table (and the jit executor's) are installed by the first start()
of a run of dumped steps and stay, idle outside start()/stop(), until a step whose next step is not
dumped ends (or close()): installing and removing them at every start() and stop() is work a dumped
step would pay each time (benchmarks/RESULTS.md, MindSpore design notes). The model's Primitives are
put back at every stop(): mindspore.jit cannot compile a Cell holding a PrimitiveCall (an evaluation
step between dumped steps may compile the model).

Also here: `Primitive` instances held by the Cells of a model passed to start() (named
`Primitive.{attribute}.{PrimitiveName}`), and user-registered custom APIs.
"""

import functools

from msprobe.core.errors import MsprobeError
from msprobe.mindspore import _state
from msprobe.mindspore.capture.ignored_apis import IGNORED_PRIMITIVES
from msprobe.mindspore.capture.primitive_attrs import describe_primitive


def _wrap(orig, prefix, name, inplace):
    def wrapper(*args, **kwargs):
        session = _state.session
        if session is None or not _state.recording or _state.busy or _state.depth:
            return orig(*args, **kwargs)
        return session.record_call(prefix, name, orig, args, kwargs, inplace=inplace)
    try:
        functools.update_wrapper(wrapper, orig)
    except (AttributeError, TypeError):  # some builtins lack __name__/__doc__
        pass
    wrapper.__msprobe_original__ = orig
    return wrapper


class PrimitiveCall:
    """Stands in for a Primitive held by a Cell: records the call, forwards attribute access.

    With an `ApiSources` (core/dump/api_sources.py) it also notes which instance each recorded call
    ran, under the same condition as the wrapper's, so call n of the name is the dump's `.{n}.`.
    """

    def __init__(self, prim, attr, sources=None):
        self.__dict__["_prim"] = prim
        self.__dict__["_name"] = f"Primitive.{attr}.{prim.name}"
        self.__dict__["_sources"] = sources
        self.__dict__["_wrapped"] = _wrap(prim, "Primitive", f"{attr}.{prim.name}", False)

    def __call__(self, *args, **kwargs):
        sources = self._sources
        if sources is not None and _state.session is not None and _state.recording and not _state.busy \
                and not _state.depth:
            sources.primitive_called(self._name, self._prim, describe_primitive)
        return self._wrapped(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._prim, name)


def _jit_call(orig):
    """Replacement of `_JitExecutor.__call__`: a jit-compiled function or Cell runs as one API `Jit.{name}`
    (the Cell's class name, e.g. Jit.SGD for an optimizer, or the function's name)."""
    def call(executor, *args, **kwargs):
        session = _state.session
        if session is None or not _state.recording or _state.busy or _state.depth:
            return orig(executor, *args, **kwargs)
        obj = executor.obj
        name = type(obj).__name__ if obj is not None else executor.fn.__name__
        return session.record_call("Jit", name, lambda *a, **k: orig(executor, *a, **k), args, kwargs)
    call.__msprobe_original__ = orig
    return call


def _grad_call(orig):
    """Replacement of `_PyNativeExecutor.grad` (a PyNative backward pass): notes which Parameters it
    differentiates while it runs, in `_state.grad_params` (GradTracker drops a gradient its hooks see
    for a Parameter the pass does not differentiate: LayerNorm's node computes gamma's anyway)."""
    def grad(executor, obj, grad_op, weights, *args):
        if _state.session is None:
            return orig(executor, obj, grad_op, weights, *args)
        prev = _state.grad_params, _state.grad_leaves
        _state.grad_params, _state.grad_leaves = _differentiated(grad_op, weights)
        try:
            return orig(executor, obj, grad_op, weights, *args)
        finally:
            _state.grad_params, _state.grad_leaves = prev
    grad.__msprobe_original__ = orig
    return grad


def _differentiated(grad_op, weights):
    """(ids, leaf-node ids) of the Parameters a grad pass differentiates; (None, None) when it cannot
    be told."""
    by_list = getattr(grad_op, "get_by_list", None)
    if by_list is False:
        return frozenset(), frozenset()
    if by_list is None or weights is None:
        return None, None
    weights = tuple(weights) if isinstance(weights, (list, tuple)) else (weights,)
    nodes = (getattr(w, "_grad_node", None) for w in weights)
    return frozenset(id(w) for w in weights), frozenset(n._unique_id() for n in nodes if n is not None)


class PatchedApis:
    """Installed wrappers, each remembered with the original it replaced."""

    def __init__(self):
        self._originals = {}  # (id(owner), attr) -> (owner, original, owner defined it itself)
        self._table = None
        self._prims = []  # (cell, attr, original primitive)
        self._prim_scan = None  # (cells, [(cell, attr, primitive, its PrimitiveCall)]): one scan per cell list
        self._wrappers = {}  # (id(owner), attr, prefix, name) -> wrapper, reused across start/stop
        self._plan = None  # what patch_builtin installed: [((id(owner), attr), originals entry, wrapper)]
        self._builtin_on = False  # patch_builtin's wrappers are installed

    def claim(self):
        """Make this the instance whose wrappers are installed: another debugger's, idle since its
        stop(), are removed first (its next start() installs them again)."""
        holder = _state.apis_patched_by
        if holder is not None and holder is not self:
            holder.restore()
        _state.apis_patched_by = self

    def patch(self, owner, attr, prefix, name=None, inplace=False):
        if (id(owner), attr) in self._originals:
            return
        orig = getattr(owner, attr, None)
        if not callable(orig):
            raise MsprobeError(f"register_custom_api: {getattr(owner, '__name__', owner)!s}.{attr} "
                               "is not a callable attribute")
        if hasattr(orig, "__msprobe_original__"):  # already wrapped under another name
            return
        # an inherited attribute (Tensor methods live on the C++ base) is deleted again on restore
        own = attr in getattr(owner, "__dict__", {})
        self._originals[(id(owner), attr)] = (owner, orig, own)
        key = (id(owner), attr, prefix, name or attr)
        wrapper = self._wrappers.get(key)
        if wrapper is None or wrapper.__msprobe_original__ is not orig:
            wrapper = self._wrappers[key] = _wrap(orig, prefix, name or attr, inplace)
        setattr(owner, attr, wrapper)

    def patch_builtin(self):
        """Wrap every API of the run-time table (api_table.py). The first call checks each entry
        (patch()); later ones replay what it did while every attribute still holds the original it
        found: start() runs every step, and the checks are the costly part of it.
        Nothing to do while they are still installed from an earlier start()."""
        if self._builtin_on:
            return
        self._builtin_on = True
        if self._plan is not None and self._replay(self._plan):
            return
        if self._table is None:
            from msprobe.mindspore.capture.api_table import build_api_table
            self._table = build_api_table()
        before = set(self._originals)
        for owner, attr, prefix, inplace in self._table:
            self.patch(owner, attr, prefix, attr, inplace)
        self._plan = [(key, entry, getattr(entry[0], key[1])) for key, entry in self._originals.items()
                      if key not in before]

    def _replay(self, plan):
        """Install `plan`'s wrappers; False (nothing changed) when an attribute no longer holds the
        original the plan was made with, or another patch took it meanwhile."""
        originals = self._originals
        for key, (owner, orig, _), _ in plan:
            if key in originals or getattr(owner, key[1], None) is not orig:
                return False
        for key, entry, wrapper in plan:
            originals[key] = entry
            setattr(entry[0], key[1], wrapper)
        return True

    def patch_jit(self):
        """Record calls of mindspore.jit-compiled functions and Cells as `Jit.{name}`."""
        from mindspore.graph import api
        cls = api._JitExecutor
        if (id(cls), "__call__") in self._originals:
            return
        orig = cls.__dict__["__call__"]
        self._originals[(id(cls), "__call__")] = (cls, orig, True)
        wrapper = self._wrappers.get("jit")
        if wrapper is None or wrapper.__msprobe_original__ is not orig:
            wrapper = self._wrappers["jit"] = _jit_call(orig)
        cls.__call__ = wrapper

    def patch_grad(self):
        """Note which Parameters each PyNative backward pass differentiates (`_grad_call`)."""
        from mindspore.graph import api  # (mindspore.common.api warns that it is deprecated when imported)
        cls = api._PyNativeExecutor
        if (id(cls), "grad") in self._originals:
            return
        orig = cls.__dict__["grad"]
        if hasattr(orig, "__msprobe_original__"):  # another debugger's, installed and working
            return
        self._originals[(id(cls), "grad")] = (cls, orig, True)
        wrapper = self._wrappers.get("grad")
        if wrapper is None or wrapper.__msprobe_original__ is not orig:
            wrapper = self._wrappers["grad"] = _grad_call(orig)
        cls.grad = wrapper

    def patch_primitives(self, cells, sources=None):
        """Wrap the Primitive instances that `cells` (a list of Cells) hold as attributes; `sources`
        (an ApiSources) learns each recorded call's constructor arguments. The same list again (the
        debugger keeps one per model) is not scanned again until restore()."""
        from mindspore.ops.primitive import Primitive
        if self._prims:
            return
        scan = self._prim_scan
        if scan is None or scan[0] is not cells:
            found = [(cell, attr, value, PrimitiveCall(value, attr)) for cell in cells
                     for attr, value in list(vars(cell).items())
                     if isinstance(value, Primitive) and value.name not in IGNORED_PRIMITIVES]
            scan = self._prim_scan = (cells, found)
        for cell, attr, prim, call in scan[1]:
            if cell.__dict__.get(attr) is prim:  # (a Primitive the model replaced since is not wrapped)
                call.__dict__["_sources"] = sources
                self._prims.append((cell, attr, prim))
                cell.__dict__[attr] = call

    def restore_primitives(self):
        """Put the model's own Primitives back: a Cell holding a PrimitiveCall cannot be compiled by
        mindspore.jit (an evaluation step between dumped steps may compile the model)."""
        for cell, name, prim in self._prims:
            cell.__dict__[name] = prim
        self._prims = []

    def restore(self, owner=None, attr=None):
        """Restore one attribute, or every patched attribute and primitive when called without arguments."""
        items = [(id(owner), attr)] if owner is not None else list(self._originals)
        for key in items:
            entry = self._originals.pop(key, None)
            if entry is not None:
                target, orig, own = entry
                if own:
                    setattr(target, key[1], orig)
                else:
                    delattr(target, key[1])
        if owner is None:
            self.restore_primitives()
            self._prim_scan = None
            self._builtin_on = False
            if _state.apis_patched_by is self:
                _state.apis_patched_by = None
