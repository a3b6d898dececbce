"""Backward records through gradient hooks on the tensors a call takes and returns.

For a call (API or Cell) each input tensor is replaced, for that call only, by a stand-in whose hook
sees the gradient flowing back through this use (`_through_hook`: a view of it with a tensor hook, or
an `ops.HookBackward` when the tensor takes no tensor hook): this call's own contribution to the
input's gradient (backward `output`). Outputs get hooks that see their gradients (backward `input`):
an API call's outputs are hooked themselves (Tensor.register_hook: an output's total gradient is what
flows back through all its uses), a Cell's too while ops run synchronously unless one of the step's
hooks is on it already (then, and in the asynchronous pipeline, through a stand-in: see hook_outputs). Hooking an input
itself would give its *total* gradient, not this call's share. Only done while MindSpore records a
gradient (`_pynative_executor.requires_grad()`), so plain inference pays nothing. A tensor MindSpore
records no gradient for (made from constants only: a sliced mask buffer, `ops.ones`) gets no hook: it
refuses a tensor hook, and no gradient would come.

While ops run synchronously (a CPU target) most inputs need no stand-in: the autograd nodes the
call made that take an input directly see, in a post-hook, the gradient that flows back through that
edge — the same tensor the stand-in's hook would get, with neither a view in forward nor a view node
in backward (grad_nodes.py; `hook_inputs(graph=...)`, `_hook_nodes`). A stand-in stays for an input
whose gradient may not be asked for (a LayerNorm node computes a data input's anyway, where a
stand-in's hook would not fire), for a tensor taken twice, and where Cells' parameters_grad records are
made, for a Parameter an API takes. A node's hook runs before MindSpore passes the gradient on, a
stand-in's after: the session holds a record completed there and sends it where the stand-in's hook
would have (DumpSession.emit_held), so the records and their order do not depend on the way.

In-place calls must change the caller's own tensor, not a stand-in: the tensor they change (the first
argument) and their result get Tensor.register_hook instead, which MindSpore ties to the tensor's value
before and after the change (a total gradient, not the call's share; the handles go at step end).

A HookBackward runs Python shape and dtype inference at every use, forward and backward; a view with a
tensor hook is a fraction of that, a tensor hook alone nearly nothing (benchmarks/RESULTS.md, MindSpore
design notes). In MindSpore's default asynchronous pipeline every hook, `.shape` and `.dtype` waits for
the queue threads to produce the tensor; what makes those waits cheap is that the debugger runs
MindSpore synchronously while it captures on a CPU target (sync_execution.py). Tried and dropped:
one HookBackward over all of a call's inputs hands zero tensors, not nothing, to inputs that get no
gradient (an integer index, an unused output), which changes the records; copies made by an ordinary
op (`x * True`) cost a kernel each; a reused HookBackward calls its latest hook for every earlier use.
"""

import mindspore as ms
from mindspore import ops

from msprobe.mindspore import _state
from msprobe.mindspore.capture.grad_nodes import LEAF, input_edges
from msprobe.mindspore.tool_work import tool_work

_executor = ms.common.api._pynative_executor


def _hooks_without_handles():
    """(register, remove): Tensor.register_hook minus its checks and its removal handle (a weak
    reference and two objects each), returning the hook's id, and the removal of a hook by that id
    (what the handle's remove() does). A stand-in's hook dies with the stand-in; a hook on a
    tensor the caller keeps is removed at step end."""
    try:
        from mindspore._c_expression import TensorPy
        return TensorPy.register_hook, TensorPy.remove_hook
    except (ImportError, AttributeError):
        return (lambda t, hook: t.register_hook(hook)), (lambda handle: handle.remove())


_register_hook, remove_hook = _hooks_without_handles()


def grad_recording():
    """True while a forward pass runs under mindspore.grad / value_and_grad / a training cell."""
    return _executor.requires_grad()


def needs_grad(v):
    """Whether MindSpore records a gradient for `v`: False for what only constants made inside the
    gradient pass (`mask[:t, :t]`, `ops.ones(...)`), which refuses a tensor hook."""
    return getattr(v, "_requires_grad", True) is not False


def _through_hook(v, hook, synchronous):
    """A tensor standing for `v` in one use, whose gradient `hook` sees: the gradient that flows back
    through that use only. With ops running synchronously a view of `v` with a tensor hook is the
    cheaper; in the asynchronous pipeline the view and the hook wait for the tensor and the
    HookBackward is the cheaper. A tensor that needs no gradient (integer, data input) refuses
    the tensor hook and gets the HookBackward, which simply never fires. The view and its hook die
    with the step's graph: no handle to remove."""
    if synchronous:
        try:
            new = v.view(v.shape)
            _register_hook(new, hook)
            return new
        except (RuntimeError, TypeError, ValueError):
            pass
    return ops.HookBackward(hook)(v)


class GradTracker:
    """Gradients of one call, emitted as one backward record when every hooked tensor saw its gradient
    (or at step end with what arrived, e.g. a data input MindSpore computes no gradient for)."""

    __slots__ = ("session", "key", "save", "parent", "out_recs", "in_recs", "left", "outs_left", "fired",
                 "waits", "seq", "in_place", "outputs_by_tensor_hook", "in_keys", "bound", "vseq", "parts", "top",
                 "cell", "params_at")

    def __init__(self, session, key, save, parent, seq=0):
        self.session, self.key, self.save, self.parent, self.seq = session, key, save, parent, seq
        self.out_recs = []
        self.in_recs = []
        self.left = 0  # hooked inputs whose gradient has not arrived
        self.outs_left = 0  # hooked outputs whose gradient has not arrived
        self.fired = False
        self.waits = []
        self.in_place = False
        self.outputs_by_tensor_hook = False  # see hook_outputs
        self.in_keys = None  # by node: (node id, output index) of each input hooked so -> its position
        self.bound = -1  # by node: nodes numbered up to this existed before the call
        self.vseq = -1  # by node: stand-ins made for all its inputs would be numbered just above this
        self.parts = None  # by node: position -> [gradient pieces still to come, sum so far]
        self.top = None  # by node: the highest number of its outputs' nodes
        self.cell = False  # a Cell's outputs hooked themselves (see hook_outputs)
        self.params_at = None  # input position -> id of the Parameter there (see _on_input)

    # -- forward: wrap tensors -----------------------------------------------------------------
    def hook_inputs(self, args, in_place=False, graph=None):
        """`args` (a tuple, lists inside kept) with each tensor passed through a hook. `in_place`: the
        call changes `args[0]`, which keeps its identity and gets a tensor hook; so does the result.
        `graph` (a NodeGraph, while ops run synchronously): the inputs whose gradient
        is surely computed stay as they are, their gradients seen on the nodes the call makes (see
        grad_nodes.py and hook_outputs); the others, and a tensor taken a second time, get stand-ins."""
        pos = [0]
        self.in_place = in_place
        if graph is not None and not in_place:
            self.in_keys = {}
            self.bound = self.vseq = graph.bound
            new = tuple(self._wrap_by_node(a, pos, graph) for a in args)
            self.in_recs = [None] * pos[0]
            return new
        if in_place and args and isinstance(args[0], ms.Tensor):
            pos[0] = 1
            if needs_grad(args[0]) and self._tensor_hook(args[0], self._input_hook(0)):
                self.left += 1
            new = (args[0],) + tuple(self._wrap_in(a, pos) for a in args[1:])
        else:
            new = tuple(self._wrap_in(a, pos) for a in args)
        self.in_recs = [None] * pos[0]
        return new

    def _wrap_by_node(self, v, pos, graph):
        if isinstance(v, ms.Tensor):
            i = pos[0]
            pos[0] += 1
            if not needs_grad(v):
                return v
            self.left += 1
            node = v._grad_node
            if node is None:  # no gradient will come: the record goes out without it
                return v
            key = (node._unique_id(), v._output_index)
            n = node._sequence_nr()
            if n != LEAF and n > self.vseq:
                self.vseq = n
                if n > self.bound:
                    self.bound = n
            if isinstance(v, ms.Parameter):
                self._param_at(i, v)
            if key not in self.in_keys and graph.needed(v, node):
                self.in_keys[key] = i
                return v
            new, n = self._standin(v, lambda seq: self._input_hook(i, seq))
            if n is not None and n > self.bound:  # older than the call: not one of its nodes
                self.bound = n
            return new
        if isinstance(v, (list, tuple)) and v and any(isinstance(x, ms.Tensor) for x in v):
            return type(v)(self._wrap_by_node(x, pos, graph) for x in v)
        return v

    def _param_at(self, i, p):
        if self.params_at is None:
            self.params_at = {}
        self.params_at[i] = id(p)

    def _standin(self, v, make_hook):
        """(a view of `v` hooked with make_hook(its node's number), that number): a stand-in while ops
        run synchronously (see _through_hook)."""
        try:
            new = v.view(v.shape)
            node = new._grad_node
            n = node._sequence_nr() if node is not None else None
            _register_hook(new, make_hook(n))
        except (RuntimeError, TypeError, ValueError):
            return ops.HookBackward(make_hook(None))(v), None
        self.session.summarizer.alias(new, v)
        self.session.hooked(new)
        return new, n

    def _tensor_hook(self, t, hook):
        """Hook `t` itself; False when it takes no hook (it needs no gradient)."""
        try:
            self.session.tensor_hooks.append(_register_hook(t, hook))
        except RuntimeError:
            return False
        self.session.hooked(t)
        return True

    def _wrap_in(self, v, pos):
        if isinstance(v, ms.Tensor):
            # every tensor, integer ones too, without asking its dtype (in MindSpore's asynchronous
            # pipeline that waits for the op making it): an integer tensor simply never sees a gradient
            i = pos[0]
            pos[0] += 1
            if not needs_grad(v):  # a constant: no gradient will come, the record needs no wait
                return v
            self.left += 1
            if isinstance(v, ms.Parameter):
                self._param_at(i, v)
            new = _through_hook(v, self._input_hook(i), self.session.synchronous)
            self.session.summarizer.alias(new, v)
            self.session.hooked(new)
            return new
        if isinstance(v, (list, tuple)) and v and any(isinstance(x, ms.Tensor) for x in v):
            return type(v)(self._wrap_in(x, pos) for x in v)
        return v

    def hook_outputs(self, out, tensor_hooks=False, cell=False):
        """`out` with each output tensor passed through a hook (same container shape).

        `tensor_hooks`: hook the output tensors themselves (Tensor.register_hook; `out` comes back
        as it is). An output's total gradient is what a stand-in would see, since every use of the
        output would go through it; no stand-in saves a view and its hook per output, and the ops
        that take a view pay for it too (MindSpore copies a view an op takes: ~0.6 ms a use for 1M
        float32 on a CPU). `cell`: the call is a Cell's, which often returns what a call inside it
        returned (a Sequential, a Dense's matmul); hooks on one tensor run in the order they were
        registered — inner call first — which would tell release_stuck that the backward pass had
        passed the inner call before its gradient had arrived. So an output that already carries
        one of the step's hooks gets a stand-in (`_standin`), whose hook runs before them.
        """
        self.outputs_by_tensor_hook = tensor_hooks or self.in_place
        self.cell = cell
        pos = [0]
        if self.in_keys is not None:
            nodes = []
            new = self._wrap_out(out, pos, nodes)
            self.out_recs = [None] * pos[0]
            if self.outs_left:
                self._hook_nodes(nodes)
            return new
        new = self._wrap_out(out, pos)
        self.out_recs = [None] * pos[0]
        return new

    def _hook_nodes(self, nodes):
        """Hook the nodes the call made that take an input hooked by node (grad_nodes.input_edges);
        an input reached by several edges (or also handed back, see _through) gets their sum, as a
        stand-in's gradient would be."""
        session = self.session
        hooked, pieces, top = input_edges(nodes, self.in_keys, self.bound)
        self.top = top
        graph = session.nodes
        if top > graph.bound:
            graph.bound = top
        if hooked:
            graph.made_from_param(nodes)
        for node, pairs in hooked:
            node.register_hook(self._node_hook(node, pairs, node._sequence_nr()))
        parts = self.parts  # pieces from outputs that are inputs (_through)
        if parts is not None:
            for p, part in parts.items():
                part[0] += pieces.pop(p, 0)
        multi = {p: [k, None] for p, k in pieces.items() if k > 1}
        if multi:
            self.parts = {**parts, **multi} if parts else multi

    def _through(self, v, p, i):
        """By node: output `i` is input `p` itself. A stand-in for it goes back to the caller: its
        gradient is both the output's and one piece of input p's share (an input hook first, as when
        the stand-in was made before the call)."""
        self.outs_left += 1
        self.parts = parts = self.parts or {}
        parts[p] = [parts[p][0] + 1, None] if p in parts else [1, None]
        new = v.view(v.shape)
        n = new._grad_node._sequence_nr()

        def hook(grads):
            if self.session is not None:
                self.session.emit_held(n)
                self._arrive(p, grads[0] if isinstance(grads, (tuple, list)) else grads)
        _register_hook(new, hook)
        _register_hook(new, self._output_hook(i, n))
        self.session.summarizer.alias(new, v)
        self.session.hooked(new)
        return new

    def _node_hook(self, node, pairs, seq):
        """A post-hook on node number `seq`, made by the call: this call's share of the inputs it
        takes (none for an input only Parameters the pass does not differentiate are made from:
        NodeGraph.unasked)."""
        def hook(grad_inputs, grad_outputs):
            session = self.session
            if session is not None:
                session.emit_held(seq)
                leaves = _state.grad_leaves
                skip = session.nodes.unasked(node, pairs, leaves) if leaves is not None else ()
                for j, p in pairs:
                    self._arrive(p, None if skip and j in skip else grad_inputs[j])
        return hook

    def _arrive(self, p, g):
        parts = self.parts
        if parts is not None and p in parts:
            g = self._piece(parts[p], g)
        if g is not None:
            self._on_input(p, g)

    @staticmethod
    def _piece(part, g):
        """One of several edges to an input brought `g`: the sum once all have (None before)."""
        if g is not None:
            if part[1] is None:
                part[1] = g
            else:
                with tool_work():
                    part[1] = part[1] + g
        part[0] -= 1
        return part[1] if part[0] == 0 else None

    def _wrap_out(self, v, pos, nodes=None):
        if isinstance(v, ms.Tensor):
            i = pos[0]
            pos[0] += 1
            if not needs_grad(v):  # made from constants only: recorded in forward, no backward
                return v
            n = None  # the number of the node whose run the output hook comes with (see emit_held)
            if nodes is not None:
                node = v._grad_node
                if node is not None:
                    p = self.in_keys.get((node._unique_id(), v._output_index))
                    if p is not None:  # an input handed back (x.astype(its own dtype)): see _through
                        return self._through(v, p, i)
                    nodes.append(node)
                    n = node._sequence_nr()
            if self.outputs_by_tensor_hook and not (self.cell and self.session.was_hooked(v)):
                if self._tensor_hook(v, self._output_hook(i, n)):
                    self.outs_left += 1
                return v
            self.outs_left += 1
            if nodes is not None:
                return self._standin(v, lambda seq: self._output_hook(i, seq))[0]
            new = _through_hook(v, self._output_hook(i), self.session.synchronous)
            self.session.summarizer.alias(new, v)
            return new
        if isinstance(v, (list, tuple)) and v and any(isinstance(x, ms.Tensor) for x in v):
            return type(v)(self._wrap_out(x, pos, nodes) for x in v)
        return v

    # -- backward: hooks (closures: HookBackward reads the hook's __code__, a partial has none) -------
    # `seq`: the number of the node that runs with the hook (None: not known), see emit_held
    def _input_hook(self, i, seq=None):
        def hook(grads):
            if self.session is not None:
                self.session.emit_held(seq)
                self._on_input(i, grads)
        return hook

    def _output_hook(self, i, seq=None):
        def hook(grads):
            self._on_output(i, grads, seq)
        return hook

    def _on_output(self, i, grads, seq=None):
        if self.session is None:
            return
        self.session.emit_held(seq)
        with tool_work():
            # the backward reached this call: later calls still waiting for an input gradient will
            # not get it (a data input MindSpore computes no gradient for); their records go out now.
            # From a tensor hook not the in-place ones: hooks on one tensor run in the order they were
            # registered, so a later in-place call's input hook on this same tensor may have yet to
            # run (they go out at the next forward call or at step end).
            if not self.in_place:
                self.session.release_stuck(self.seq, keep_in_place=self.outputs_by_tensor_hook)
            g = grads[0] if isinstance(grads, (tuple, list)) else grads
            if g is not None and self.out_recs[i] is None:
                stem = f"{self.key}.input.{i}" if self.save else None  # a file name only for a file
                self.out_recs[i] = self.session.gradient_record(g, stem, self.save, self.waits)
            self.outs_left -= 1
            if self.left <= 0 and self.outs_left <= 0:
                self._emit()
            elif self.outs_left <= 0:
                self.session.stuck[self] = None

    def _on_input(self, i, grads):
        if self.session is None:
            return
        with tool_work():
            g = grads[0] if isinstance(grads, (tuple, list)) else grads
            if g is not None and self.params_at is not None and i in self.params_at:
                asked = _state.grad_params
                if asked is not None and self.params_at[i] not in asked:
                    g = None  # a Parameter this pass does not differentiate: no gradient, as in PyTorch
            if g is not None and self.in_recs[i] is None:
                stem = f"{self.key}.output.{i}" if self.save else None
                self.in_recs[i] = self.session.gradient_record(g, stem, self.save, self.waits)
            self.left -= 1
            if self.left <= 0 and self.outs_left <= 0:
                self._emit()

    def _emit(self, now=False):
        if self.fired or self.session is None:
            return
        self.fired = True
        session, self.session = self.session, None
        session.emit_backward(self, now)

    def emit_partial(self):
        """At step end: emit what arrived if any gradient did; drop the tracker otherwise."""
        if self.session is not None and any(r is not None for r in self.out_recs + self.in_recs):
            with tool_work():
                self._emit(now=True)  # where a stand-in's record would go out too
        self.session = None
