"""L0 capture: forward pre/post hooks on every sub-Cell of the model(s) passed to start(); backward
through GradTracker (inputs and outputs passed through HookBackward by the hooks themselves);
parameter gradients through Parameter hooks. The root Cell itself is not recorded.
"""

from msprobe.mindspore import _state


def named_subcells(models):
    """(path, cell) for every sub-Cell; a list/tuple of models prefixes paths with the index."""
    roots = [(None, models)] if not isinstance(models, (list, tuple)) else list(enumerate(models))
    for index, root in roots:
        for name, cell in root.cells_and_names():
            if name:
                yield (f"{index}.{name}" if index is not None else name), cell


def all_cells(models):
    roots = [models] if not isinstance(models, (list, tuple)) else list(models)
    return [c for root in roots for _, c in root.cells_and_names()]


class CellCapture:
    """Owns the Cell hooks. Forward hooks live between attach() and detach() (start/stop);
    parameter-gradient hooks stay until release() (step end), since backward may follow stop()."""

    def __init__(self, models):
        self.cells = list(named_subcells(models))
        self._fwd_handles = []
        self._grad_handles = []
        self._frames = []

    def attach(self):
        if self._fwd_handles:
            return
        for path, cell in self.cells:
            base = f"Cell.{path}.{type(cell).__name__}"
            self._fwd_handles.append(cell.register_forward_pre_hook(self._pre(base), with_kwargs=True))
            self._fwd_handles.append(cell.register_forward_hook(self._post(cell), with_kwargs=True))
        if not self._grad_handles:
            self._attach_grad_hooks()

    def detach(self):
        for h in self._fwd_handles:
            h.remove()
        self._fwd_handles = []

    def release(self):
        self.detach()
        for h in self._grad_handles:
            h.remove()
        self._grad_handles = []

    # -- forward -------------------------------------------------------------------------------
    def _pre(self, base):
        def hook(cell, args, kwargs):
            session = _state.session
            if session is None or _state.busy or _state.depth:
                self._frames.append(None)
                return None
            index = session.counter.next(base)
            key = f"{base}.forward.{index}"
            enclosing = session.module_stack
            want = session.filter.want_call(key, enclosing)
            parent = enclosing[-1] if enclosing else None
            session.module_stack.append(key)
            if not want:
                self._frames.append((key, parent, None))
                return None
            _state.busy = True
            try:
                frame, new_args = session.begin_cell(key, args, kwargs)
            finally:
                _state.busy = False
            self._frames.append((key, parent, frame))
            return (new_args, kwargs) if new_args is not args else None
        return hook

    def _post(self, cell):
        def hook(c, args, kwargs, output):
            entry = self._frames.pop() if self._frames else None
            session = _state.session
            if entry is None or session is None:
                return None
            key, parent, frame = entry
            if session.module_stack and session.module_stack[-1] == key:
                session.module_stack.pop()
            if frame is None:
                return None
            _state.busy = True
            try:
                new_out = session.end_cell(key, parent, cell, frame, output)
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
            state = _ParamGradState(f"Cell.{path}.{type(cell).__name__}", [n for n, _ in params])
            for name, p in params:
                self._grad_handles.append(p.register_hook(state.hook(name)))


class _ParamGradState:
    """Collects the gradients of one Cell's parameters; emits parameters_grad when all arrived."""

    def __init__(self, base, names):
        self.base = base
        self.names = names
        self.got = {}

    def hook(self, name):
        def on_grad(grad):
            session = _state.session
            if session is None or self.base not in session.recorded_cells:
                return None
            prev, _state.busy = _state.busy, True
            try:
                self.got[name] = grad
                if len(self.got) == len(self.names):
                    got, self.got = self.got, {}
                    session.emit_params_grad(self.base, got)
            finally:
                _state.busy = prev
            return None
        return on_grad
