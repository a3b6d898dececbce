/* Reading the autograd graph around one call (capture/backward.py's input_edges and the choice
 * _attach_one_node makes) in C, for msprobe._call (call.c). See edges.c. */
#ifndef MSPROBE_EDGES_H
#define MSPROBE_EDGES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* the node types backward.py tells apart, and the tensor types taken as plain */
typedef struct {
    PyObject *tensor, *parameter;                 /* torch.Tensor, torch.nn.Parameter */
    PyObject *acc_grad, *transpose, *to_copy;      /* AccumulateGrad, TBackward0, ToCopyBackward0 */
    PyObject *reshapes;                            /* a tuple of the reshaping node types (backward._RESHAPES) */
} NodeTypes;

/* one_node's answers besides -1 (an error, raised) */
#define ONE_NODE_NONE 0     /* the output has no node: nothing to hook */
#define ONE_NODE_HOOK 1     /* hook *node */
#define ONE_NODE_OTHER 2    /* not one node like that: the general walk decides */

int edges_init(void);

/* a Python scalar as records take it: an exact int, float or str, or a bool */
static inline int is_scalar(PyObject *x) {
    return PyLong_CheckExact(x) || PyFloat_CheckExact(x) || PyBool_Check(x) || PyUnicode_CheckExact(x);
}

/* 1 when `x` neither is nor holds a tensor as flat_tensors sees it: None, a scalar, or any other value that
 * is not a tensor, list, tuple or dict (a dtype, a slice, Ellipsis); 0 when it is or may hold one; -1 on error */
int holds_no_tensor(const NodeTypes *nt, PyObject *x);

/* TorchCallOps.backward_begin's state for a call about to run with positional `args` (a tuple), each a plain
 * tensor, a value that holds no tensor, or a list or tuple of those: a new (input_edges(flat_tensors(args)),
 * the _state module's watermark for a `module`, else None); NULL without an error for any other argument
 * (the caller takes the Python path) */
PyObject *begin_state(const NodeTypes *nt, PyObject *state, PyObject *args, int module);

/* backward._attach_one_node's choice for a call whose output `out` (a plain tensor with a node) came from
 * inputs `edges` (edges_of_args' list); `floor` the watermark at a module's start or None; `state` the
 * _state module; `fold` the session's fold_transposes. ONE_NODE_HOOK sets *node (the node to hook), *top
 * (out.grad_fn), *slots (the NodeHook's) and *split, all new references but split, and raises the
 * watermark to out's node, as _attach_one_node does before it hooks. */
int one_node(const NodeTypes *nt, PyObject *state, PyObject *edges, PyObject *floor, PyObject *out, int fold,
             PyObject **node, PyObject **top, PyObject **slots, int *split);

/* backward._attach_walk's walk of the nodes a call made, from `roots` (its outputs' nodes) back to its inputs
 * (`leaf`: id(tensor) -> position, `nonleaf`: (id(node), output_nr) -> position), through nodes numbered
 * above `floor`, at most `max_nodes`: a new (edges, cast_to) as the Python walk makes them, or NULL */
PyObject *walk_edges(const NodeTypes *nt, PyObject *roots, PyObject *leaf, PyObject *nonleaf, long long floor,
                     Py_ssize_t max_nodes);

#endif
