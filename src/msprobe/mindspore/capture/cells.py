"""L0 capture: forward pre/post hooks on every sub-Cell of the model(s) passed to start(); backward
through GradTracker (inputs and outputs passed through HookBackward by the hooks themselves);
parameter gradients through Parameter hooks. The root Cell itself is not recorded.

A Cell with a custom `bprop` takes no forward hook (MindSpore ignores one) and its construct runs
without recording a gradient: its forward record comes from its construct, wrapped for the step, and
its backward record from its bprop (dout in, the gradients it returns out), whose ops are not recorded.
"""

import mindspore as ms

from msprobe.core import naming
from msprobe.mindspore import _state


def is_jit_cell(cell):
    """A Cell whose construct is compiled by mindspore.jit (runs as one graph inside PyNative)."""
    return bool(getattr(cell.construct, "__wrapped_by_jit__", False))


def _walk(cell, path, out, inside_jit, seen=None):
    seen = set() if seen is None else seen
    for name, child in cell.name_cells().items():
        if id(child) in seen:  # a Cell held twice is recorded under its first path
            continue
        seen.add(id(child))
        child_path = f"{path}.{name}" if path else name
        out.append((child_path, child, inside_jit))
        _walk(child, child_path, out, inside_jit or is_jit_cell(child), seen)


def named_subcells(models, include_jit_inner=False):
    """(path, cell) for every sub-Cell; a list/tuple of models prefixes paths with the index.

    Cells inside a jit-compiled Cell are left out: MindSpore would compile a hook put on them into
    the graph (and fail on it); the jit Cell itself is hooked from the outside, in PyNative.
    """
    roots = [(None, models)] if not isinstance(models, (list, tuple)) else list(enumerate(models))
    for index, root in roots:
        found = []
        _walk(root, str(index) if index is not None else "", found, is_jit_cell(root))
        for path, cell, inside_jit in found:
            if include_jit_inner or not inside_jit:
                yield path, cell


def all_cells(models):
    """The model(s) and their sub-Cells, none inside a jit-compiled Cell (see named_subcells)."""
    roots = [models] if not isinstance(models, (list, tuple)) else list(models)
    out = [r for r in roots if not is_jit_cell(r)]
    for root in roots:
        out += [c for _, c in named_subcells(root) if not is_jit_cell(c)]
    return out


def jit_cells(models):
    """(path, cell) of the outermost jit-compiled sub-Cells."""
    return [(p, c) for p, c in named_subcells(models) if is_jit_cell(c)]


class CellCapture:
    """Owns the Cell hooks. Forward hooks record between attach() and detach() (start/stop);
    parameter-gradient hooks until end_step(), since backward may follow stop(). The hooks stay
    installed until release() (another model, or the end of a step whose next step is not dumped):
    registering them at every start() costs more than an idle hook's flag check. A model with a
    custom-bprop Cell has its forward hooks removed at every detach() (its wrapped construct goes)."""

    def __init__(self, models):
        self.cells = list(named_subcells(models))
        self._fwd_handles = []
        self._grad_handles = []
        self._grad_states = []
        self._frames = []
        self.forward_active = False
        self.grads_active = False
        self._bprop_cells = []  # Cells with a custom bprop whose construct and bprop are wrapped
        self._bprop_pending = {}  # id(cell) -> [(forward key, save, backward parent)], latest last

    def attach(self):
        self.forward_active = self.grads_active = True
        if self._fwd_handles:
            return
        for path, cell in self.cells:
            jit = is_jit_cell(cell)
            custom_bprop = bool(getattr(cell, "has_bprop", False)) and not jit
            pre = self._pre(path, type(cell).__name__, jit, cell if custom_bprop else None)
            self._fwd_handles.append(cell.register_forward_pre_hook(pre, with_kwargs=True))
            if custom_bprop:
                self._wrap_bprop_cell(cell)
            else:
                self._fwd_handles.append(cell.register_forward_hook(self._post(cell), with_kwargs=True))
        if not self._grad_handles:
            self._attach_grad_hooks()

    def detach(self):
        self.forward_active = False
        if not self._bprop_cells:
            return
        self._remove_forward_hooks()

    def _remove_forward_hooks(self):
        for h in self._fwd_handles:
            h.remove()
        self._fwd_handles = []
        for cell in self._bprop_cells:  # the bprop stays wrapped until release(): backward may follow
            cell.__dict__.pop("construct", None)

    def end_step(self):
        """The step is over: the hooks stay, idle, for the next dumped step."""
        self.forward_active = self.grads_active = False
        self._frames = []
        for state in self._grad_states:
            state.got = {}

    def release(self):
        self.end_step()
        self._remove_forward_hooks()
        for h in self._grad_handles:
            h.remove()
        self._grad_handles = []
        self._grad_states = []
        for cell in self._bprop_cells:
            cell.__dict__.pop("bprop", None)
        self._bprop_cells = []
        self._bprop_pending = {}

    # -- Cells with a custom bprop -------------------------------------------------------------------
    def _wrap_bprop_cell(self, cell):
        if cell.__dict__.get("construct") is not None:
            return
        construct, bprop, post = type(cell).construct.__get__(cell), cell.bprop, self._post(cell)

        def wrapped_construct(*args, **kwargs):
            out = construct(*args, **kwargs)
            new = post(cell, args, kwargs, out)
            return out if new is None else new

        def wrapped_bprop(*args):
            pending = self._bprop_pending.get(id(cell))
            entry = pending.pop() if pending else None
            _state.depth += 1  # the bprop's own ops are the backward of this Cell, not forward calls
            try:
                grads = bprop(*args)
            finally:
                _state.depth -= 1
            session = _state.session
            if entry is not None and session is not None and session.filter.backward and not _state.busy:
                _state.busy = True
                try:
                    _emit_bprop_record(session, entry, args[-1], grads)
                finally:
                    _state.busy = False
            return grads

        object.__setattr__(cell, "construct", wrapped_construct)
        object.__setattr__(cell, "bprop", wrapped_bprop)
        self._bprop_cells.append(cell)

    # -- forward -------------------------------------------------------------------------------
    def _pre(self, path, cls, jit, bprop_cell=None):
        base = f"Cell.{path}.{cls}"  # the counter's name: forward and parameters_grad count apart

        def hook(cell, args, kwargs):
            session = _state.session
            if session is None or not self.forward_active or _state.busy or _state.depth:
                self._frames.append(None)
                return None
            key = naming.module_key("Cell", path, cls, naming.FORWARD, session.counter.next(base))
            enclosing = session.module_stack
            want = session.filter.want_call(key, enclosing)
            parent = enclosing[-1] if enclosing else None
            session.module_stack.append(key)
            if not want:
                self._frames.append((key, parent, None, None))
                return None
            _state.busy = True
            try:
                graph = session.graph if jit else None
                # a jit Cell is also recorded in graph/ (what msProbe's in-graph dump gives at its border)
                graph_frame = graph.begin_cell(key, None, args, kwargs, track=False)[0] if graph is not None else None
                frame, new_args = session.begin_cell(key, parent, args, kwargs, track=bprop_cell is None)
                if bprop_cell is not None:
                    self._bprop_pending.setdefault(id(bprop_cell), []).append(
                        (key, session.saves_tensor(key), naming.backward_of(parent) if parent else None))
            finally:
                _state.busy = False
            self._frames.append((key, parent, frame, graph_frame))
            return (new_args, kwargs) if new_args is not args else None
        return hook

    def _post(self, cell):
        def hook(c, args, kwargs, output):
            entry = self._frames.pop() if self._frames else None
            session = _state.session
            if entry is None or session is None:
                return None
            key, parent, frame, graph_frame = entry
            if session.module_stack and session.module_stack[-1] == key:
                session.module_stack.pop()
            if frame is None:
                return None
            _state.busy = True
            try:
                if graph_frame is not None and session.graph is not None:
                    session.graph.end_cell(graph_frame, cell, output)
                new_out = session.end_cell(frame, cell, output)
            finally:
                _state.busy = False
            return new_out if new_out is not output else None
        return hook

    # -- parameter gradients -------------------------------------------------------------------
    def _attach_grad_hooks(self):
        seen = set()
        for path, cell in self.cells:
            params = [(n, p) for n, p in cell.parameters_and_names(expand=False)
                      if p.requires_grad and id(p) not in seen]
            if not params:
                continue
            seen.update(id(p) for _, p in params)
            state = _ParamGradState(self, f"Cell.{path}.{type(cell).__name__}", [n for n, _ in params])
            self._grad_states.append(state)
            for name, p in params:
                self._grad_handles.append(p.register_hook(state.hook(name)))


def _emit_bprop_record(session, entry, dout, grads):
    """The backward record of a Cell with a custom bprop: `dout` (the gradients of its outputs) as input,
    the gradients its bprop returned as output."""
    from msprobe.mindspore.capture.backward import GradTracker
    session.emit_held()  # records node hooks completed before this bprop ran go first
    key, save, parent = entry
    tracker = GradTracker(session, naming.backward_of(key), save, parent)
    douts = dout if isinstance(dout, (tuple, list)) else (dout,)
    outs = grads if isinstance(grads, (tuple, list)) else (grads,)
    tracker.out_recs = [session.gradient_record(g, f"{tracker.key}.input.{i}", save, tracker.waits)
                        if isinstance(g, ms.Tensor) else None for i, g in enumerate(douts)]
    tracker.in_recs = [session.gradient_record(g, f"{tracker.key}.output.{i}", save, tracker.waits)
                       if isinstance(g, ms.Tensor) else None for i, g in enumerate(outs)]
    tracker.left = tracker.outs_left = 0
    tracker._emit()


class _ParamGradState:
    """Collects the gradients of one Cell's parameters; emits parameters_grad when all arrived."""

    def __init__(self, owner, base, names):
        self.owner = owner
        self.base = base
        self.names = names
        self.got = {}

    def hook(self, name):
        def on_grad(grad):
            session = _state.session
            if session is None or not self.owner.grads_active:
                return None
            session.gradients_arrived()  # the optimizer may update the Parameters from now on
            if self.base not in session.recorded_modules:
                return None
            prev, _state.busy = _state.busy, True
            try:
                session.params_grad_arriving(self.base)
                self.got[name] = grad
                if len(self.got) == len(self.names):
                    got, self.got = self.got, {}
                    session.emit_params_grad(self.base, got)
            finally:
                _state.busy = prev
            return None
        return on_grad
