"""L0 capture: forward pre/post hooks on every submodule of the model(s) passed to start(), backward
through BackwardTracker (no full-backward-hook views, so in-place modules work), and parameter
gradients through post-accumulate-grad hooks. The root module itself is not recorded.
"""

import torch

from msprobe.core.dump.call_capture import CallFrame
from msprobe.core.naming import params_grad_names
from msprobe.pytorch import _state
from msprobe.pytorch.capture.recompute import graph_task_id, recomputing
from msprobe.pytorch.tool_work import tool_work

try:
    from msprobe._call import ModuleHook as _ModuleHook, ParamGradHook as _ParamGradHook
except ImportError:  # the extension is not built: the Python hooks alone
    _ModuleHook = _ParamGradHook = None


def own_parameters(module):
    """`module.named_parameters(recurse=False)` without its generator machinery: the module's own
    registered parameters, unset (None) ones left out (read only when its record is made)."""
    return ((n, p) for n, p in module._parameters.items() if p is not None)


def class_name(module):
    """The module's class name; fully_shard's FSDP{Class} subclass is named by the model's own class (the
    same keys as the unsharded model's)."""
    cls = type(module)
    bases = cls.__bases__
    if len(bases) == 2 and bases[0].__name__ == "FSDPModule":
        return bases[1].__name__
    return cls.__name__


def named_submodules(models):
    """(path, module) for every submodule; a list/tuple of models prefixes paths with the index. A module
    torch.compile wrapped is named and hooked as the module inside (the wrapper's hooks would run outside
    the compiled code, and eager names it without `_orig_mod`); a root wrapped in DDP is named as the
    model itself, so its records pair with a single process's."""
    if isinstance(models, torch.nn.Module):
        roots = [(None, models)]
    else:
        roots = list(enumerate(models))
    for index, root in roots:
        for name, mod in unwrapped(root).named_modules():
            if is_compiled_wrapper(mod):
                continue
            name = ".".join(p for p in name.split(".") if p != "_orig_mod")
            if name:
                yield (f"{index}.{name}" if index is not None else name), mod


def is_compiled_wrapper(module):
    """An `OptimizedModule`: what torch.compile(module) returns (checked by name: no Dynamo import)."""
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


# data-parallel wrappers: their `module` is the model, named as a single process names it (no `module.`)
_DATA_PARALLEL_WRAPPERS = frozenset({"DistributedDataParallel", "DataParallel"})


def unwrapped(module):
    """The model inside torch.compile's and data-parallel wrappers given as the root."""
    while True:
        if is_compiled_wrapper(module):
            module = module._orig_mod
        elif (type(module).__name__ in _DATA_PARALLEL_WRAPPERS
              and isinstance(getattr(module, "module", None), torch.nn.Module)):
            module = module.module
        else:
            return module


def has_compiled_modules(models):
    """Whether torch.compile wraps any of the models or their submodules (or `module.compile()` did).
    Asked at every start() once Dynamo is loaded: a walk of the `_modules` tables, without the
    qualified names `modules()` builds for every submodule."""
    todo = [models] if isinstance(models, torch.nn.Module) else list(models or ())
    seen = set()
    pop, extend, add = todo.pop, todo.extend, seen.add
    while todo:
        m = pop()
        if m is None or id(m) in seen:
            continue
        add(id(m))
        attrs = m.__dict__  # (Module's attribute lookup, and a call per module, cost more than the walk)
        if attrs.get("_compiled_call_impl") is not None or (
                type(m).__name__ == "OptimizedModule" and is_compiled_wrapper(m)):
            return True
        extend(attrs["_modules"].values())
    return False


class ModuleCapture:
    """Owns the module hooks. They are installed once and stay until release() (close, another
    model, or the end of a step whose next step is not dumped): installing two hooks per module at
    every start() costs more than an idle hook's flag check, while a step that is not dumped runs
    without them.
    Forward hooks record between attach() and detach() (start/stop); parameter-gradient hooks until
    end_step(), since backward may follow stop()."""

    def __init__(self, models, compiled=None):
        self.modules = list(named_submodules(models))
        self.compiled = compiled  # capture/compiled.py while a compiled model may run: Dynamo traces the hooks
        self._fwd_handles = []
        self._grad_handles = []
        self._hooked_compiled = None  # `compiled` when the forward hooks were made
        self._frames = []
        self.forward_active = False
        self.grads_active = False

    def attach(self):
        self.forward_active = self.grads_active = True
        if self._fwd_handles and self._hooked_compiled is None and self.compiled is not None:
            # made before Dynamo was loaded (a model compiled since, in place): again, with the compile check
            for h in self._fwd_handles + self._grad_handles:
                h.remove()
            self._fwd_handles, self._grad_handles = [], []
        if self._fwd_handles:
            return
        self._hooked_compiled = self.compiled
        for path, mod in self.modules:
            base = f"Module.{path}.{class_name(mod)}"
            self._fwd_handles.append(mod.register_forward_pre_hook(self._hook(self._pre(base), base, False),
                                                                   with_kwargs=True))
            self._fwd_handles.append(mod.register_forward_hook(self._hook(self._post(mod, base), base, True),
                                                               with_kwargs=True, always_call=True))
        if not self._grad_handles:
            self._attach_grad_hooks()

    def detach(self):
        self.forward_active = False

    def end_step(self):
        self.forward_active = self.grads_active = False

    def release(self):
        self.end_step()
        for h in self._fwd_handles + self._grad_handles:
            h.remove()
        self._fwd_handles, self._grad_handles = [], []

    # -- forward -------------------------------------------------------------------------------
    def _hook(self, slow, base, post):
        """The hook torch calls: msprobe._call's ModuleHook, which records the common case in C and hands
        every other to `slow` (the Python hook below); where Dynamo may trace it, behind a Python check that
        Dynamo reads as a constant, so a traced call takes `slow` (a C callable would break its graph)."""
        if _ModuleHook is None:
            return slow
        return _behind_compile_check(self.compiled, slow,
                                     _ModuleHook(self, _state, base, self._frames, graph_task_id, slow, post))

    def _pre(self, base):
        compiled = self.compiled

        def hook(module, args, kwargs):
            if compiled is not None and compiled.is_compiling():
                return compiled.traced_module_begin(base, module, args, kwargs) if self.forward_active else None
            session = _state.session
            if (session is None or not self.forward_active or _state.busy or _state.depth
                    or (graph_task_id() != -1 and recomputing())):
                self._frames.append(None)
                return None
            key = f"{base}.forward.{session.counter.next(base)}"
            enclosing = session.module_stack
            flt = session.filter
            if flt.passes_everything:  # no scope or list (want_call's answer, without its frame)
                flt.hit = want = True
            else:
                want = flt.want_call(key, enclosing)
            parent = enclosing[-1] if enclosing else None
            enclosing.append(key)
            if not want:
                self._frames.append((key, parent, None))
                return None
            path = session.call_path
            if path is not None:
                frame = path.begin(session, key, parent, base, args, kwargs)
            else:
                frame = session.calls.begin(session, key, parent, args, kwargs)[0]
            self._frames.append((key, parent, frame))
            return None
        return hook

    def _post(self, module, base):
        compiled = self.compiled

        def hook(mod, args, kwargs, output):
            if compiled is not None and compiled.is_compiling():
                if self.forward_active:
                    compiled.traced_module_end(base, module, output)
                return None
            entry = self._frames.pop() if self._frames else None
            session = _state.session
            if entry is None or session is None:
                return None
            key, parent, frame = entry
            if session.module_stack and session.module_stack[-1] == key:
                session.module_stack.pop()
            if frame is None:
                return None
            if type(frame) is not CallFrame:  # begun by the session's call_path
                if session.call_path is not None:  # (else a session begun since: the call is dropped)
                    session.call_path.end(session, frame, output, module._parameters)
            else:
                session.calls.end(session, frame, output, params=own_parameters(module) if module._parameters else ())
            return None
        return hook

    # -- parameter gradients -------------------------------------------------------------------
    def _attach_grad_hooks(self):
        seen = set()
        for path, mod in self.modules:
            params = [(n, p) for n, p in mod.named_parameters(recurse=False)
                      if p.requires_grad and id(p) not in seen]
            if not params:
                continue
            seen.update(id(p) for _, p in params)
            state = _ParamGradState(self, f"Module.{path}.{class_name(mod)}", [n for n, _ in params])
            for name, p in params:
                self._grad_handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(state, name)))

    def _grad_hook(self, state, name):
        """A parameter's hook: msprobe._call's ParamGradHook, which records the common case in C and hands
        every other to the Python one; behind Dynamo's check where Dynamo may trace it (see _hook)."""
        slow = state.hook(name)
        if _ParamGradHook is None:
            return slow
        return _behind_compile_check(self.compiled, slow, _ParamGradHook(state, name, _state, slow))


def _behind_compile_check(compiled, slow, fast):
    """C hook `fast` as torch calls it: itself while Dynamo is not loaded (`compiled` None), else behind a
    Python check Dynamo reads as a constant, so that a traced call takes the Python hook `slow`."""
    if compiled is None:
        return fast
    is_compiling = compiled.is_compiling

    def hook(*args):
        return (slow if is_compiling() else fast)(*args)
    return hook


class _ParamGradState:
    """Collects the accumulated .grad of one module's parameters; emits parameters_grad when all arrived.
    `counted` and `stem`: its counter's name and its key without the index (the C hook's; the session's
    `emit_params_grad` makes them from `base`)."""

    def __init__(self, owner, base, names):
        self.owner = owner
        self.base = base
        self.names = names
        self.got = {}
        self.counted, self.stem = params_grad_names(base)

    def hook(self, name):
        def on_grad(param):
            session = _state.session
            if session is None or not self.owner.grads_active or self.base not in session.recorded_modules:
                return
            got = self.got
            got[name] = param.grad
            if len(got) == len(self.names):
                # in the order the module holds them: autograd's order differs with compiled backward
                got, self.got = {n: got[n] for n in self.names}, {}
                with tool_work():
                    session.emit_params_grad(self.base, got)
        return on_grad
