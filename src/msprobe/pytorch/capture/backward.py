"""Backward records without touching the autograd graph's tensors.

For a call (API or module) we find the autograd nodes it created — a walk from its outputs' grad_fn
back to its inputs' nodes — and hook those nodes: a pre-hook on each output node sees the gradients of
the outputs (backward `input`), a hook on each node with an edge into an input sees the gradient that
flows through that edge (backward `output`: this call's contribution to the input's gradient).
A node that is both has one post-hook, which sees both.
Unlike identity-Function wrapping (what `register_full_backward_hook` does), this creates no views,
so in-place ops on inputs or outputs keep working, and the numbers are untouched.

An input that reaches the call through a cast of a leaf (autocast casts a weight once per region and
every call in it shares that cast) is hooked where the gradient enters the cast, not where it leaves:
what leaves is the sum over all the calls sharing it, what enters is this call's share.

At L1 an input reached from the call's node through transposes, reshapes and casts the call made
(F.linear's `weight.t()`, its flattening of a 3-d input, autocast's casts) is read by the call's one
hook, as those nodes' backwards would hand the gradient on, and a call whose output reshapes its node's
(F.linear's view of its 2-d product) gets a pre-hook on that reshape for the output's gradient.
"""

import functools
import weakref
from types import MappingProxyType

import torch
from torch._C import DisableTorchFunction

from msprobe.pytorch import _state
from msprobe.pytorch.tool_work import tool_work

try:
    from msprobe._call import NodeHook as _NodeHook, walk as _walk
except ImportError:  # not built: every one-node hook is a OneNodeHook, every walk in Python
    _NodeHook = _walk = None

# Safety bound on the nodes one call may have created (a walk that escapes is cut here).
MAX_NODES = 4096
# a tracker's input sums, edge counts and casts when it has none (most calls): shared, read-only
_NONE = MappingProxyType({})
# node types told apart by type, not by name() or a failed attribute read (both cost more per node)
_ACCUMULATE_GRAD = torch._C._functions.AccumulateGrad
_TRANSPOSE = torch._C._functions.TBackward0
_TO_COPY = torch._C._functions.ToCopyBackward0
# nodes whose backward only reshapes the gradient (to `_saved_self_sym_sizes`): F.linear and matmul on a
# 3-d input flatten it into a 2-d product and view the product back
_RESHAPES = (torch._C._functions.ViewBackward0, torch._C._functions.UnsafeViewBackward0,
             torch._C._functions.ReshapeAliasBackward0)
# what msprobe._call's CallPath reads the graph with (its edges.c does args_edges and _attach_one_node's choice)
NODE_TYPES = (_ACCUMULATE_GRAD, _TRANSPOSE, _TO_COPY, _RESHAPES)
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_TENSOR = torch.Tensor
_CONTAINERS = (list, tuple, dict)


class _Gone:
    __slots__ = ("__weakref__",)


# what a one-node hook's session reference becomes once it has fired: a dead reference
_FIRED = weakref.ref(_Gone())


def input_edges(tensors):
    """Where each input tensor enters the autograd graph: (id, grad_fn, output_nr, dtype), None when it
    needs no gradient. Read before the call runs: an in-place call (F.relu(x, inplace=True),
    nn.ReLU(inplace=True)) rebases its input onto its own node, hiding the edge the gradient leaves by."""
    return [(id(x), x.grad_fn, x.output_nr, x.dtype) if x.requires_grad else None for x in tensors]


def args_edges(args):
    """`input_edges` of the tensors among a call's positional arguments, in one pass; None when one of
    them is a container (the caller flattens them first)."""
    edges = []
    for x in args:
        if isinstance(x, _TENSOR):
            edges.append((id(x), x.grad_fn, x.output_nr, x.dtype) if x.requires_grad else None)
        elif isinstance(x, _CONTAINERS):
            return None
    return edges


def _leaf_cast(node, leaf):
    """(input position, the leaf's dtype) when `node` only casts a leaf input of the call (autocast's
    ToCopyBackward of a weight, made by the first call of a region and shared by the rest), else None."""
    if type(node) is not _TO_COPY:
        return None
    nexts = [n for n, _ in node.next_functions if n is not None]
    var = getattr(nexts[0], "variable", None) if len(nexts) == 1 else None
    pos = leaf.get(id(var)) if var is not None else None
    return None if pos is None else (pos, var.dtype)


def _leads_to_leaves_only(node, wanted):
    """True when every edge of `node` ends at a leaf tensor that is not one of the call's inputs (the
    `weight.t()` inside F.linear): then no gradient of an input flows through it."""
    for nxt, _ in node.next_functions:
        if nxt is None:
            continue
        if type(nxt) is not _ACCUMULATE_GRAD or id(nxt.variable) in wanted:
            return False
    return True


# what a node's backward does to the gradient on its way to the input (OneNodeHook applies them in order)
_T, _RESHAPE, _CAST = 0, 1, 2
_TRANSPOSED = (_T, None)
# a chain from the call's node to its input: F.linear under autocast casts, flattens and transposes
_MAX_CHAIN = 4


def _input_chain(node, wanted, made_after, inputs):
    """(input position, steps) when the gradient leaving through `node`, made by the call, reaches a
    wanted input through nodes that each have one edge and only transpose it (F.linear's
    `weight.t()`), reshape it (its flattening of a 3-d input) or cast it (autocast's casts), all made
    by the call; `steps`: what their backwards do to it, in order: (_T, None), (_RESHAPE, sizes),
    (_CAST, the input's dtype). Else None. The call's one hook then reads the gradient as those nodes
    would hand it on, before they run: the session allows that (`fold_transposes`) only where no other
    record can come in between."""
    steps = []
    while len(steps) < _MAX_CHAIN:
        kind = type(node)
        if kind is _TRANSPOSE:
            steps.append(_TRANSPOSED)
        elif kind in _RESHAPES:
            sizes = getattr(node, "_saved_self_sym_sizes", None)
            if sizes is None:
                return None
            steps.append((_RESHAPE, tuple(sizes)))
        elif kind is _TO_COPY:
            steps.append(None)  # (to the input's dtype, known at its end)
        else:
            return None
        nexts = node.next_functions
        if len(nexts) != 1 or nexts[0][0] is None:
            return None
        nxt, nr = nexts[0]
        leaf = type(nxt) is _ACCUMULATE_GRAD
        pos = wanted.get(id(nxt.variable)) if leaf else wanted.get((id(nxt), nr))
        if pos is not None:
            if None in steps:
                if steps.count(None) > 1:
                    return None
                steps[steps.index(None)] = (_CAST, inputs[pos][3])
            return pos, tuple(steps)
        if leaf or nxt._sequence_nr() <= made_after:
            return None
        node = nxt
    return None


def _made_after(inputs, floor):
    """The highest sequence number of a node the call did not make: `floor` (default the watermark) or
    its inputs' nodes'."""
    made_after = _state.seq_watermark if floor is None else floor
    for edge in inputs:
        if edge is not None and edge[1] is not None:
            seq = edge[1]._sequence_nr()
            if seq > made_after:
                made_after = seq
    return made_after


def _raise_watermark(node):
    """The watermark up to a call's output node, the last it made: a later call takes only the nodes
    numbered above the watermark as its own."""
    seq = node._sequence_nr()
    if _state.seq_watermark < seq:
        _state.seq_watermark = seq


def _walk_nodes(out_nodes, leaf, nonleaf, floor):
    """The nodes a call made, walked from its outputs' (`out_nodes`: id -> (node, outputs)) back to its
    inputs (`leaf`: id(tensor) -> position, `nonleaf`: (id(node), output_nr) -> position) through nodes
    numbered above `floor`: `edges` (id -> (node, [(slot, input position)])) and `cast_to` (position -> a
    leaf's dtype, for an input read before autocast's cast of it)."""
    edges, cast_to = {}, {}
    # id -> node, held: a node's Python object may die mid-walk (torch keeps it only while someone
    # refers to it) and a node met later may get its id, which would then read as visited
    seen = {key: n for key, (n, _) in out_nodes.items()}
    todo = list(seen.values())
    while todo:
        node = todo.pop()
        for slot, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            var = nxt.variable if type(nxt) is _ACCUMULATE_GRAD else None  # a leaf tensor
            pos = leaf.get(id(var)) if var is not None else nonleaf.get((id(nxt), nr))
            # leaf inputs only
            cast = _leaf_cast(nxt, leaf) if pos is None and leaf and type(nxt) is _TO_COPY else None
            if cast is not None:
                pos, cast_to[pos] = cast
            if pos is not None:
                edges.setdefault(id(node), (node, []))[1].append((slot, pos))
            elif var is None and id(nxt) not in seen and nxt._sequence_nr() > floor and len(seen) < MAX_NODES:
                seen[id(nxt)] = nxt
                todo.append(nxt)
    return edges, cast_to


def _added(parts):
    """parts[0] + parts[1] + ..., in that order."""
    total = parts[0]
    for g in parts[1:]:
        total = total + g
    return total


class BackwardTracker:
    """Gradients of one call, emitted as one backward record when every hooked node has run."""

    __slots__ = ("session", "key", "save", "parent", "out_recs", "in_recs", "in_sums", "waits", "pending",
                 "fired", "multi", "cast_to")

    def __init__(self, session, key, save, parent, n_out, n_in):
        self.session, self.key, self.save, self.parent = session, key, save, parent
        # Gradients are summarised the moment they arrive: autograd may later accumulate into the
        # very tensors it handed us, once no one else holds them. The parts of an input's gradient that
        # several edges bring are held until the last comes (in_sums): held, autograd adds to them
        # out of place (tests/pytorch/test_gradient_sums.py checks the record against autograd's own).
        self.out_recs = [None] * n_out
        self.in_recs = [None] * n_in
        self.in_sums = _NONE  # pos -> (gradients so far, edges still to come), for inputs reached by several edges
        self.waits = [] if save else ()  # file writes: only a tracker that saves has any
        self.pending = 0
        self.fired = False
        self.multi = _NONE  # input position -> number of edges reaching it, when more than one
        self.cast_to = _NONE  # input position -> the leaf's dtype, when its gradient is read before a cast

    @classmethod
    def attach(cls, session, key, inputs, outputs, save, parent, floor=None):
        """Hook the nodes of one call. Returns the tracker, or None when no output needs a gradient.

        Args:
            inputs: `input_edges(...)` of the call's input tensors, taken before the call ran.
            outputs: the call's output tensors.
            floor: `_state.seq_watermark` as it was when the call started (default: as it is now).
                A module must pass it: the calls recorded inside it have raised the watermark above
                the nodes the module's own walk has to cross.
        """
        if len(outputs) == 1:
            tracker = cls._attach_one_node(session, key, inputs, outputs[0], save, parent, floor)
            if tracker is not False:
                return tracker
        return cls._attach_walk(session, key, inputs, outputs, save, parent, floor)

    @classmethod
    def _attach_walk(cls, session, key, inputs, outputs, save, parent, floor=None):
        """`attach` by a walk of the nodes the call created, from its outputs back to its inputs."""
        out_nodes = {}
        for i, o in enumerate(outputs):
            gf = o.grad_fn if o.requires_grad else None
            if gf is not None:
                out_nodes.setdefault(id(gf), (gf, []))[1].append((o.output_nr, i))
        if not out_nodes:
            return None
        leaf, nonleaf = {}, {}
        floor = _state.seq_watermark if floor is None else floor
        for pos, edge in enumerate(inputs):
            if edge is not None:
                xid, gf, nr, _ = edge
                if gf is None:
                    leaf[xid] = pos
                else:
                    nonleaf[(id(gf), nr)] = pos
                    floor = max(floor, gf._sequence_nr())
        if not leaf and not nonleaf:  # no input needs a gradient (a model fed token ids): no edge to find
            edges, cast_to = _NONE, _NONE
        elif _walk is not None and NODE_TYPES is not None:  # the same walk in C (edges.c)
            edges, cast_to = _walk([n for n, _ in out_nodes.values()], leaf, nonleaf, floor, MAX_NODES, NODE_TYPES)
        else:
            edges, cast_to = _walk_nodes(out_nodes, leaf, nonleaf, floor)
        for n, _ in out_nodes.values():
            _raise_watermark(n)
        tracker = cls(session, key, save, parent, len(outputs), len(inputs))
        hit = {}
        shared = False  # an input reached by several edges
        for _, slots in edges.values():
            for _, pos in slots:
                c = hit[pos] = hit.get(pos, 0) + 1
                shared = shared or c > 1
        if shared:
            tracker.multi, tracker.in_sums = {p: c for p, c in hit.items() if c > 1}, {}
        if cast_to:
            tracker.cast_to = cast_to
        if len(out_nodes) == 1 and len(edges) == 1 and next(iter(out_nodes)) == next(iter(edges)):
            # one node made the outputs and takes the inputs (most single ops): its post-hook sees
            # both gradients, before the engine passes any on, so one hook does
            (gf, outs), = out_nodes.values()
            (_, slots), = edges.values()
            tracker.pending = 1
            gf.register_hook(functools.partial(tracker._on_inputs, slots, outs=outs))
            return tracker
        # a node that made outputs and takes inputs (F.linear's addmm; its weight comes through a
        # transpose node) has one post-hook for both, as above
        pending = len(out_nodes)
        for nid, (gf, outs) in out_nodes.items():
            if nid in edges:
                gf.register_hook(functools.partial(tracker._on_inputs, edges[nid][1], outs=outs))
            else:
                gf.register_prehook(functools.partial(tracker._on_outputs, outs))
        for nid, (node, slots) in edges.items():
            if nid not in out_nodes:
                node.register_hook(functools.partial(tracker._on_inputs, slots))
                pending += 1
        tracker.pending = pending
        return tracker

    @classmethod
    def _attach_one_node(cls, session, key, inputs, out, save, parent, floor=None):
        """`attach` for the most common call: one output, made by one node whose edges lead straight
        to the inputs that need a gradient, each once, and to no other node this call created: one
        `OneNodeHook` on that node. Where the session folds (L1), the output may be a reshape of that
        node's (F.linear on a 3-d input views its 2-d product back: the reshape gets a pre-hook too)
        and an edge may reach its input through transposes, reshapes and casts made here
        (`_input_chain`): the hook reads what they would hand on. Returns the hook (None where it fires
        in C, a `NodeHook`: nothing for the session to keep), or False when the call is not like that (the
        general walk then decides)."""
        gf = top = out.grad_fn  # None when `out` needs no gradient
        if gf is None:
            return None
        wanted = {}
        for pos, edge in enumerate(inputs):
            if edge is not None:
                xid, xgf, nr, _ = edge
                key_in = xid if xgf is None else (id(xgf), nr)
                if key_in in wanted:  # one tensor passed twice: two edges to sum
                    return False
                wanted[key_in] = pos
        # (slot, input position, how the gradient reaches it: False straight, else the steps of a chain
        # of nodes made here, see _input_chain): one per wanted input
        slots = []
        # nodes numbered above this were made by the call (the highest of `floor` and its inputs' nodes):
        # read only when an edge leads to a node that is not an input's (most calls' edges lead to inputs)
        made_after = None
        fold = session is not None and session.fold_transposes
        split = False  # the output reshapes the product of a node made here: a pre-hook on the reshape too
        if fold and type(gf) in _RESHAPES:
            nexts = gf.next_functions
            inner = nexts[0][0] if len(nexts) == 1 else None
            if (inner is not None and type(inner) is not _ACCUMULATE_GRAD and (id(inner), nexts[0][1]) not in wanted
                    and inner._sequence_nr() > (made_after := _made_after(inputs, floor))):
                gf, split = inner, True
        slot = -1
        for nxt, nr in gf.next_functions:
            slot += 1
            if nxt is None:
                continue
            if type(nxt) is _ACCUMULATE_GRAD:  # a leaf tensor
                pos = wanted.get(id(nxt.variable))
                if pos is not None:
                    slots.append((slot, pos, False))
                continue
            pos = wanted.get((id(nxt), nr))
            if pos is not None:
                slots.append((slot, pos, False))
                continue
            if made_after is None:
                made_after = _made_after(inputs, floor)
            if nxt._sequence_nr() > made_after:
                got = _input_chain(nxt, wanted, made_after, inputs) if fold else None
                if got is not None:
                    slots.append((slot, got[0], got[1]))
                elif not _leads_to_leaves_only(nxt, wanted):
                    return False  # a node made inside this call whose edges may reach the inputs too
        if len(slots) != len(wanted) or not slots or (len(slots) > 1 and len({p for _, p, _ in slots}) != len(slots)):
            return False  # (an input reached by two edges: to sum)
        _raise_watermark(top)
        if _NodeHook is not None and not save and session is not None and session.call_path is not None:
            # fired in C, the common case (the session's C call path is on: nothing is saved)
            hook = _NodeHook(session.weak_self, key, parent, len(inputs), out.output_nr, tuple(slots), split)
            kept = None  # (fires in C: nothing for the session to keep)
        else:
            hook = kept = OneNodeHook(session, key, save, parent, len(inputs), out.output_nr, slots, split)
        if split:
            top.register_prehook(hook.read_output)
        gf.register_hook(hook)
        return kept

    def _record(self, role, i, g):
        session = self.session
        if not self.save and type(g) in _PLAIN:  # the common case, without gradient_record's frame
            summarizer = session.summarizer
            return summarizer.record(g, True, summarizer.share_forward)
        stem = f"{self.key}.{role}.{i}" if self.save else None  # a file name only for a file
        return session.gradient_record(g, stem, self.save, self.waits)

    def _with_part(self, parts, g):
        """`parts` and gradient `g`: kept apart where the summarizer reads their sum in one pass, else added up
        as they come (one tensor held, not each part: on an accelerator that is device memory)."""
        if not parts or (not self.save and self.session.summarizer.reads_sums):
            return parts + (g,)
        return (parts[0] + g,)

    def _record_sum(self, pos, parts):
        """The record of input `pos`'s gradient, the sum of what its edges brought (`parts`, in arrival
        order): read without the sum in memory where the summarizer can, else added up and recorded."""
        if not self.save:
            rec = self.session.summarizer.sum_record(parts)
            if rec is not None:
                return rec
        return self._record("output", pos, _added(parts))

    def _record_outputs(self, outs, grad_outputs):
        """(called doing tool work)"""
        for nr, i in outs:
            g = grad_outputs[nr]
            if g is not None:
                self.out_recs[i] = self._record("input", i, g)

    def _on_outputs(self, outs, grad_outputs):
        """Pre-hook of a node that made outputs of the call."""
        if self.session is not None:
            with tool_work():
                self._record_outputs(outs, grad_outputs)
        self._done_one()

    def _on_inputs(self, slots, grad_inputs, grad_outputs, outs=()):
        """Post-hook of a node with edges into the call's inputs; `outs`: the outputs it made too (a call
        made of one node), whose gradients come first."""
        if self.session is not None:
            with tool_work():
                if outs:
                    self._record_outputs(outs, grad_outputs)
                for slot, pos in slots:
                    g = grad_inputs[slot]
                    if g is None:
                        continue
                    if pos in self.cast_to:  # what the shared cast's backward would make of this call's share
                        g = g.to(self.cast_to[pos])
                    if pos in self.multi:
                        parts, left = self.in_sums.get(pos, ((), self.multi[pos]))
                        parts = self._with_part(parts, g)
                        if left > 1:  # (held: autograd then adds to them out of place, never into them)
                            self.in_sums[pos] = (parts, left - 1)
                            continue
                        self.in_sums.pop(pos, None)
                        self.in_recs[pos] = self._record_sum(pos, parts)
                        continue
                    self.in_recs[pos] = self._record("output", pos, g)
        self._done_one()

    def _done_one(self):
        self.pending -= 1
        if self.pending == 0:
            self._emit()

    def _emit(self):
        if self.fired or self.session is None:
            return
        self.fired = True
        session, self.session = self.session, None
        with tool_work():
            for pos, (parts, _) in self.in_sums.items():  # edges that never ran: record what arrived
                stem = f"{self.key}.output.{pos}" if self.save else None
                self.in_recs[pos] = session.gradient_record(_added(parts), stem, self.save, self.waits)
            self.in_sums = _NONE
            session.emit_backward(self)

    def emit_partial(self):
        """At step end: emit what arrived if any hooked node ran; drop the tracker otherwise."""
        if self.session is not None and any(r is not None for r in self.out_recs):
            self._emit()
        self.session = None


class OneNodeHook:
    """The backward of a call hooked on one node (`BackwardTracker._attach_one_node`): its post-hook reads
    the output's gradient, then the inputs' (each reached by one edge; through transposes, reshapes
    or casts, whose backwards are done here, not hooked, where its slot says so), and emits the record, in
    one go. Where the call's output is a reshape of that node's (`split`), the output's gradient is read
    as it enters the reshape, by the reshape's pre-hook (`read_output`): that is the tensor the general
    walk reads (the reshape's backward may copy it into another layout). It is never partial, so the
    session keeps no list of these: it holds the session weakly, and a session whose step has ended
    (`backward_open` false) or a hook that has fired records nothing."""

    __slots__ = ("session", "key", "save", "parent", "n_in", "out_nr", "slots", "split", "out_rec", "waits")

    def __init__(self, session, key, save, parent, n_in, out_nr, slots, split=False):
        self.session = _FIRED if session is None else session.weak_self
        self.key, self.save, self.parent, self.n_in = key, save, parent, n_in
        self.out_nr, self.slots = out_nr, slots
        self.split = split
        self.out_rec = None
        self.waits = None

    def _output_record(self, session, g, waits):
        """(called doing tool work)"""
        if g is None:
            return None
        if not self.save and type(g) in _PLAIN:
            summarizer = session.summarizer
            return summarizer.record(g, True, summarizer.share_forward)
        return session.gradient_record(g, f"{self.key}.input.0" if self.save else None, self.save, waits)

    def read_output(self, grad_outputs):
        """Pre-hook of the reshape that made the call's output (`split`)."""
        session = self.session()
        if session is None or not session.backward_open:
            return
        self.waits = waits = [] if self.save else ()
        busy, _state.busy = _state.busy, True
        try:
            with DisableTorchFunction():
                self.out_rec = self._output_record(session, grad_outputs[self.out_nr], waits)
        finally:
            _state.busy = busy

    def __call__(self, grad_inputs, grad_outputs):
        session = self.session()
        if session is None or not session.backward_open:
            return
        self.session = _FIRED  # once: a retained graph's second backward is not this step's call
        key, save = self.key, self.save
        in_recs = [None] * self.n_in
        summarizer = session.summarizer
        summarize = None if save else summarizer.record
        shared = summarizer.share_forward
        busy, _state.busy = _state.busy, True  # tool work (tool_work.py), without its frames
        try:
            with DisableTorchFunction():
                if self.split:  # read by the reshape's pre-hook (none if it never ran)
                    out_rec, waits = self.out_rec, self.waits if self.waits is not None else ([] if save else ())
                    self.out_rec = self.waits = None
                else:
                    waits = [] if save else ()
                    out_rec = self._output_record(session, grad_outputs[self.out_nr], waits)
                for slot, pos, how in self.slots:
                    g = grad_inputs[slot]
                    if g is None:
                        continue
                    if how is not False:  # what the chain's backwards hand the input (_input_chain)
                        for step, arg in how:
                            g = g.t() if step == _T else g.reshape(arg) if step == _RESHAPE else g.to(arg)
                    if summarize is not None and type(g) in _PLAIN:
                        in_recs[pos] = summarize(g, True, shared)
                    else:
                        in_recs[pos] = session.gradient_record(g, f"{key}.output.{pos}" if save else None, save,
                                                               waits)
                session.emit_backward_record(key, [out_rec], in_recs, waits, self.parent)
        finally:
            _state.busy = busy
