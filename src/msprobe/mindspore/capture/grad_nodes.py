"""Which autograd nodes of a PyNative step take a call's inputs: how a call's share of each input's
gradient is seen without a stand-in (capture/backward.py, GradTracker's `by node` way).

MindSpore 2.10 gives every tensor made while a gradient is recorded an autograd node
(`Tensor._grad_node`, numbered in creation order by `_sequence_nr()`, leaves numbered `LEAF`), and each
node's `next_functions` name the (node, output index) each of its inputs came from. The nodes a call
makes are those numbered above every node that existed before it; those of them with an edge to one of
the call's inputs hand, in a post-hook `hook(grad_inputs, grad_outputs)`, exactly the gradient that
flows back through this use of it: what a stand-in view of the input would have seen.

One difference: a stand-in's hook never fires for an input whose gradient nobody asked for (a data
input when only the weights are differentiated), while some nodes (LayerNorm's) compute every input's
gradient regardless. So an input is hooked by node only when its gradient is surely computed: a
Parameter that requires one, or a tensor made from one (`needed`); the others keep a stand-in.
"""

import mindspore as ms

LEAF = 2 ** 64 - 1  # the number of a leaf's node (a Parameter, an input being differentiated)
_WALK = 16  # nodes `needed` looks at before answering "not known" (then: a stand-in)


class NodeGraph:
    """What one step's calls learned about its autograd graph."""

    __slots__ = ("bound", "params", "made_from_params", "param_inputs", "_asked", "_asked_of")

    def __init__(self, param_inputs=True):
        # False: a Parameter a call takes keeps a stand-in. Where Cells' parameters_grad records are
        # made (L0, mix), its leaf then gets the gradients one by one, in the order the records had.
        self.param_inputs = param_inputs
        self.bound = -1  # the highest node number a call hooked by node has seen (all older than later calls)
        self.params = set()  # ids of the leaf nodes of Parameters that require a gradient
        self.made_from_params = {}  # (node id, number) -> whether a Parameter's gradient flows through it
        self._asked = {}  # (node id, number) -> whether the running grad pass wants the gradient into it
        self._asked_of = None  # the grad pass's leaves `_asked` was found for

    def add_params(self, params):
        """Parameters (the model's trainable ones) whose gradient is surely computed: what L0, which
        sees no call take them, walks back to. Their leaf nodes live as long as they do."""
        for p in params:
            node = p._grad_node
            if node is not None:
                self.params.add(node._unique_id())

    def needed(self, v, node):
        """Whether the gradient of input `v` (autograd node `node`) is surely computed."""
        if node._sequence_nr() == LEAF:
            if isinstance(v, ms.Parameter):
                self.params.add(node._unique_id())
                return self.param_inputs
            return False
        return self._reaches_param(node)

    def _reaches_param(self, node):
        memo = self.made_from_params
        key = (node._unique_id(), node._sequence_nr())
        hit = memo.get(key)
        if hit is not None:
            return hit
        stack, seen, budget = [node], {key}, _WALK
        while stack and budget:
            budget -= 1
            for m, _ in stack.pop().next_functions:
                if m is None:
                    continue
                uid, n = m._unique_id(), m._sequence_nr()
                if n == LEAF:
                    if uid in self.params:
                        memo[key] = True
                        return True
                    continue
                k = (uid, n)
                hit = memo.get(k)
                if hit:
                    memo[key] = True
                    return True
                if hit is None and k not in seen:
                    seen.add(k)
                    stack.append(m)
        if not stack:  # looked at all of it: no Parameter behind it
            memo[key] = False
        return False

    def unasked(self, node, pairs, leaves):
        """The edges j of `pairs` ((edge, position)) of `node` whose gradient the running grad pass does
        not want: it reaches only Parameters the pass does not differentiate (`leaves`: the leaf-node
        ids of those it does). MindSpore's LayerNorm node computes gamma's gradient all the same, where
        a stand-in's hook sees nothing and PyTorch computes nothing. Empty when it differentiates every
        Parameter seen."""
        if self.params <= leaves:
            return ()
        if self._asked_of is not leaves:
            self._asked, self._asked_of = {}, leaves
        edges = node.next_functions
        return [j for j, _ in pairs if edges[j][0] is not None and not self._wanted(edges[j][0], leaves)]

    def _wanted(self, node, leaves):
        """Whether a leaf the pass wants is behind `node` (a walk through every node behind it, each
        answer kept for the pass)."""
        memo = self._asked
        root = (node._unique_id(), node._sequence_nr())
        hit = memo.get(root)
        if hit is not None:
            return hit
        params = self.params
        below = {}
        stack = [(node, root, False)]
        while stack:
            n, key, done = stack.pop()
            if done:  # every node it leads to is answered
                memo[key] = any(memo[k] for k in below.pop(key))
                continue
            if key in memo:
                continue
            if key[1] == LEAF:  # a Parameter's leaf: wanted when differentiated; another leaf: an input
                memo[key] = key[0] in leaves or key[0] not in params
                continue
            kids = [(m, (m._unique_id(), m._sequence_nr())) for m, _ in n.next_functions if m is not None]
            below[key] = [k for _, k in kids]
            stack.append((n, key, True))
            stack.extend((m, k, False) for m, k in kids if k not in memo)
        return memo[root]

    def made_from_param(self, nodes):
        """The output `nodes` of a call with an input hooked by node carry a Parameter's gradient."""
        memo = self.made_from_params
        for node in nodes:
            memo[(node._unique_id(), node._sequence_nr())] = True


def input_edges(out_nodes, keys, bound):
    """The edges from the nodes a call made to its inputs, walking back from its outputs' nodes
    through those numbered above `bound`. `keys`: (node id, output index) -> input position.
    Returns ([(node, [(edge index, input position)])], {input position: edges reaching it}, the
    highest output node number)."""
    seen = set()
    stack = []
    top = bound
    for node in out_nodes:
        uid = node._unique_id()
        if uid not in seen:
            seen.add(uid)
            stack.append(node)
        n = node._sequence_nr()
        if n != LEAF and n > top:
            top = n
    hooked, pieces = [], {}
    if not keys:
        return hooked, pieces, top
    while stack:
        node = stack.pop()
        pairs = None
        for j, (m, idx) in enumerate(node.next_functions):
            if m is None:
                continue
            uid = m._unique_id()
            p = keys.get((uid, idx))
            if p is not None:
                if pairs is None:
                    pairs = []
                pairs.append((j, p))
                pieces[p] = pieces.get(p, 0) + 1
            elif uid not in seen and bound < m._sequence_nr() != LEAF:
                seen.add(uid)
                stack.append(m)
        if pairs is not None:
            hooked.append((node, pairs))
    return hooked, pieces, top
