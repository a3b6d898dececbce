/* The autograd graph around one call, read in C for msprobe._call (call.c): what backward.py's
 * args_edges reads of a call's inputs before it runs, and the choice _attach_one_node makes after it ran
 * (one node to hook, and through which of its edges each input's gradient leaves). The objects made are
 * the Python functions' own (edge tuples, NodeHook slots), so either side may take over from the other:
 * anything but the common case answers "not here" and backward.py decides as before.
 * Node attributes are read by name through the C-API: no torch headers. */
#include "edges.h"

static PyObject *s_requires_grad, *s_grad_fn, *s_output_nr, *s_dtype, *s_next_functions, *s_variable,
    *s_sequence_nr, *s_saved_sizes, *s_seq_watermark;

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return -1

int edges_init(void) {
    INTERN(s_requires_grad, "requires_grad");
    INTERN(s_grad_fn, "grad_fn");
    INTERN(s_output_nr, "output_nr");
    INTERN(s_dtype, "dtype");
    INTERN(s_next_functions, "next_functions");
    INTERN(s_variable, "variable");
    INTERN(s_sequence_nr, "_sequence_nr");
    INTERN(s_saved_sizes, "_saved_self_sym_sizes");
    INTERN(s_seq_watermark, "seq_watermark");
    return 0;
}

/* node._sequence_nr(), or -1 with an error */
static long long sequence_nr(PyObject *node) {
    PyObject *got = PyObject_CallMethodNoArgs(node, s_sequence_nr);
    if (got == NULL)
        return -1;
    long long seq = PyLong_AsLongLong(got);
    Py_DECREF(got);
    return seq;
}

/* (id(x), x.grad_fn, x.output_nr, x.dtype), or None when x needs no gradient: a new reference */
static PyObject *edge_of(PyObject *x) {
    PyObject *rg = PyObject_GetAttr(x, s_requires_grad);
    if (rg == NULL)
        return NULL;
    int needs = PyObject_IsTrue(rg);
    Py_DECREF(rg);
    if (needs <= 0)
        return needs < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *id = PyLong_FromVoidPtr(x), *gf = PyObject_GetAttr(x, s_grad_fn), *nr = PyObject_GetAttr(x, s_output_nr),
             *dt = PyObject_GetAttr(x, s_dtype), *edge = NULL;
    if (id != NULL && gf != NULL && nr != NULL && dt != NULL)
        edge = PyTuple_Pack(4, id, gf, nr, dt);
    Py_XDECREF(id);
    Py_XDECREF(gf);
    Py_XDECREF(nr);
    Py_XDECREF(dt);
    return edge;
}

/* appends the edges of argument `x` (`depth` 0: a call's own argument, 1: an item of a list or tuple one) as
 * input_edges(flat_tensors(...)) makes them: 1, 0 when it is not this case (backward.py's), -1 on error */
static int add_edges(const NodeTypes *nt, PyObject *edges, PyObject *x, int depth) {
    PyTypeObject *t = Py_TYPE(x);
    if (t == (PyTypeObject *)nt->tensor || t == (PyTypeObject *)nt->parameter) {
        PyObject *edge = edge_of(x);
        int err = edge == NULL || PyList_Append(edges, edge) < 0;
        Py_XDECREF(edge);
        return err ? -1 : 1;
    }
    if ((PyList_Check(x) || PyTuple_Check(x)) && depth == 0) {  /* (torch.Size, an index tuple, cat's tensors) */
        PyObject *seq = PySequence_Fast(x, "");
        if (seq == NULL)
            return -1;
        int got = 1;
        for (Py_ssize_t i = 0; got == 1 && i < PySequence_Fast_GET_SIZE(seq); i++)
            got = add_edges(nt, edges, PySequence_Fast_GET_ITEM(seq, i), 1);
        Py_DECREF(seq);
        return got;
    }
    return holds_no_tensor(nt, x);  /* (a nested container, a tensor subclass: backward.py's) */
}

int holds_no_tensor(const NodeTypes *nt, PyObject *x) {
    if (x == Py_None || is_scalar(x))
        return 1;
    if (PyList_Check(x) || PyTuple_Check(x) || PyDict_Check(x))
        return 0;
    int sub = PyObject_IsInstance(x, nt->tensor);  /* (a plain tensor too: the caller asks about others) */
    return sub < 0 ? -1 : !sub;
}

/* input_edges(flat_tensors(args)) for positional arguments of plain tensors, plain values and lists or tuples
 * of those: a new list, or NULL without an error (see begin_state) */
static PyObject *edges_of_args(const NodeTypes *nt, PyObject *args) {
    PyObject *edges = PyList_New(0);
    if (edges == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); i++) {
        int got = add_edges(nt, edges, PyTuple_GET_ITEM(args, i), 0);
        if (got != 1) {
            Py_DECREF(edges);  /* (an error stays set; 0: backward.py's) */
            return NULL;
        }
    }
    return edges;
}

PyObject *begin_state(const NodeTypes *nt, PyObject *state, PyObject *args, int module) {
    PyObject *edges = edges_of_args(nt, args), *floor, *got;
    if (edges == NULL)
        return NULL;
    if ((floor = module ? PyObject_GetAttr(state, s_seq_watermark) : Py_NewRef(Py_None)) == NULL) {
        Py_DECREF(edges);
        return NULL;
    }
    got = PyTuple_Pack(2, edges, floor);
    Py_DECREF(edges);
    Py_DECREF(floor);
    return got;
}

/* state.seq_watermark = max(it, node's sequence number): 0, or -1 on error */
static int raise_watermark(PyObject *state, PyObject *node) {
    long long seq = sequence_nr(node), mark;
    PyObject *wm;
    if ((seq == -1 && PyErr_Occurred()) || (wm = PyObject_GetAttr(state, s_seq_watermark)) == NULL)
        return -1;
    mark = PyLong_AsLongLong(wm);
    Py_DECREF(wm);
    if (mark == -1 && PyErr_Occurred())
        return -1;
    if (mark >= seq)
        return 0;
    PyObject *now = PyLong_FromLongLong(seq);
    int err = now == NULL || PyObject_SetAttr(state, s_seq_watermark, now) < 0;
    Py_XDECREF(now);
    return err ? -1 : 0;
}

/* The inputs that need a gradient, as _attach_one_node's `wanted` keys them: a leaf by the tensor, any
 * other by (its node, output_nr); nr -1 for a leaf. */
typedef struct {
    Py_ssize_t n;
    void *id[16];
    long long nr[16];
    Py_ssize_t pos[16];
} Wanted;

static Py_ssize_t wanted_pos(const Wanted *w, void *id, long long nr) {
    for (Py_ssize_t i = 0; i < w->n; i++)
        if (w->id[i] == id && w->nr[i] == nr)
            return w->pos[i];
    return -1;
}

/* the position of the input an edge (nxt, nr) of a node leads to, -1 when none; -2 on an error. `*leaf`:
 * nxt is an AccumulateGrad. */
static Py_ssize_t edge_pos(const NodeTypes *nt, const Wanted *w, PyObject *nxt, PyObject *nr_obj, int *leaf) {
    *leaf = Py_TYPE(nxt) == (PyTypeObject *)nt->acc_grad;
    if (*leaf) {
        PyObject *var = PyObject_GetAttr(nxt, s_variable);
        if (var == NULL)
            return -2;
        Py_ssize_t pos = wanted_pos(w, var, -1);
        Py_DECREF(var);
        return pos;
    }
    long long nr = PyLong_AsLongLong(nr_obj);
    if (nr == -1 && PyErr_Occurred())
        return -2;
    return wanted_pos(w, nxt, nr);
}

static int is_reshape(const NodeTypes *nt, PyObject *node) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(nt->reshapes); i++)
        if (Py_TYPE(node) == (PyTypeObject *)PyTuple_GET_ITEM(nt->reshapes, i))
            return 1;
    return 0;
}

/* node.next_functions as a tuple of (node, nr) pairs: a new reference, or NULL */
static PyObject *nexts_of(PyObject *node) {
    PyObject *nexts = PyObject_GetAttr(node, s_next_functions);
    if (nexts != NULL && !PyTuple_Check(nexts)) {
        Py_DECREF(nexts);
        PyErr_SetString(PyExc_TypeError, "next_functions is not a tuple");
        return NULL;
    }
    return nexts;
}

/* backward._made_after: the highest sequence number of a node the call did not make */
static int made_after_of(PyObject *state, PyObject *edges, PyObject *floor, long long *out) {
    PyObject *wm = floor == Py_None ? PyObject_GetAttr(state, s_seq_watermark) : Py_NewRef(floor);
    if (wm == NULL)
        return -1;
    long long made = PyLong_AsLongLong(wm);
    Py_DECREF(wm);
    if (made == -1 && PyErr_Occurred())
        return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(edges); i++) {
        PyObject *edge = PyList_GET_ITEM(edges, i);
        if (edge == Py_None || PyTuple_GET_ITEM(edge, 1) == Py_None)
            continue;
        long long seq = sequence_nr(PyTuple_GET_ITEM(edge, 1));
        if (seq == -1 && PyErr_Occurred())
            return -1;
        if (seq > made)
            made = seq;
    }
    *out = made;
    return 0;
}

/* backward._input_chain: 1 with *pos and *steps (a new tuple) when the gradient leaving through `node`
 * reaches a wanted input through transposes, reshapes and casts the call made; 0 when not; -1 on error */
static int input_chain(const NodeTypes *nt, const Wanted *w, PyObject *edges, PyObject *node, long long made_after,
                       Py_ssize_t *pos, PyObject **steps) {
    PyObject *st[4] = {NULL, NULL, NULL, NULL};  /* NULL at a cast: to the input's dtype, known at the end */
    int n = 0, casts = 0, cast_at = -1, got = 0;
    Py_INCREF(node);
    while (n < 4) {
        if (Py_TYPE(node) == (PyTypeObject *)nt->transpose) {
            st[n] = Py_BuildValue("(iO)", 0, Py_None);
        } else if (is_reshape(nt, node)) {
            PyObject *sizes = PyObject_GetAttr(node, s_saved_sizes), *tup;
            if (sizes == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                    goto fail;
                PyErr_Clear();
                goto done;
            }
            tup = sizes == Py_None ? NULL : PySequence_Tuple(sizes);
            Py_DECREF(sizes);
            if (tup == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                goto done;
            }
            st[n] = Py_BuildValue("(iN)", 1, tup);
        } else if (Py_TYPE(node) == (PyTypeObject *)nt->to_copy) {
            casts++;
            cast_at = n;
            n++;
            goto next;
        } else {
            goto done;
        }
        if (st[n] == NULL)
            goto fail;
        n++;
    next:;
        PyObject *nexts = nexts_of(node);
        if (nexts == NULL)
            goto fail;
        if (PyTuple_GET_SIZE(nexts) != 1 || PyTuple_GET_ITEM(PyTuple_GET_ITEM(nexts, 0), 0) == Py_None) {
            Py_DECREF(nexts);
            goto done;
        }
        PyObject *nxt = PyTuple_GET_ITEM(PyTuple_GET_ITEM(nexts, 0), 0);
        int leaf;
        Py_ssize_t p = edge_pos(nt, w, nxt, PyTuple_GET_ITEM(PyTuple_GET_ITEM(nexts, 0), 1), &leaf);
        if (p == -2) {
            Py_DECREF(nexts);
            goto fail;
        }
        if (p >= 0) {
            Py_DECREF(nexts);
            if (casts > 1)
                goto done;
            if (casts == 1) {
                PyObject *edge = PyList_GET_ITEM(edges, p);
                if ((st[cast_at] = Py_BuildValue("(iO)", 2, PyTuple_GET_ITEM(edge, 3))) == NULL)
                    goto fail;
            }
            if ((*steps = PyTuple_New(n)) == NULL)
                goto fail;
            for (int i = 0; i < n; i++) {
                PyTuple_SET_ITEM(*steps, i, st[i]);
                st[i] = NULL;
            }
            *pos = p;
            got = 1;
            goto done;
        }
        long long seq = leaf ? 0 : sequence_nr(nxt);
        if (seq == -1 && PyErr_Occurred()) {
            Py_DECREF(nexts);
            goto fail;
        }
        if (leaf || seq <= made_after) {
            Py_DECREF(nexts);
            goto done;
        }
        Py_INCREF(nxt);
        Py_SETREF(node, nxt);
        Py_DECREF(nexts);
    }
done:
    for (int i = 0; i < 4; i++)
        Py_XDECREF(st[i]);
    Py_DECREF(node);
    return got;
fail:
    for (int i = 0; i < 4; i++)
        Py_XDECREF(st[i]);
    Py_DECREF(node);
    return -1;
}

/* backward._leads_to_leaves_only: 1 when every edge of `node` ends at a leaf that is not an input, 0 when
 * not, -1 on error */
static int leaves_only(const NodeTypes *nt, const Wanted *w, PyObject *node) {
    PyObject *nexts = nexts_of(node);
    if (nexts == NULL)
        return -1;
    int answer = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(nexts) && answer == 1; i++) {
        PyObject *nxt = PyTuple_GET_ITEM(PyTuple_GET_ITEM(nexts, i), 0);
        if (nxt == Py_None)
            continue;
        int leaf;
        Py_ssize_t p = edge_pos(nt, w, nxt, PyTuple_GET_ITEM(PyTuple_GET_ITEM(nexts, i), 1), &leaf);
        answer = p == -2 ? -1 : (leaf && p < 0);
    }
    Py_DECREF(nexts);
    return answer;
}

int one_node(const NodeTypes *nt, PyObject *state, PyObject *edges, PyObject *floor, PyObject *out, int fold,
             PyObject **node_out, PyObject **top_out, PyObject **slots_out, int *split_out) {
    Wanted w;
    w.n = 0;
    if (!PyList_Check(edges) || PyList_GET_SIZE(edges) > 16)
        return ONE_NODE_OTHER;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(edges); i++) {
        PyObject *edge = PyList_GET_ITEM(edges, i);
        if (edge == Py_None)
            continue;
        PyObject *xgf = PyTuple_GET_ITEM(edge, 1);
        void *id = xgf == Py_None ? PyLong_AsVoidPtr(PyTuple_GET_ITEM(edge, 0)) : (void *)xgf;
        long long nr = xgf == Py_None ? -1 : PyLong_AsLongLong(PyTuple_GET_ITEM(edge, 2));
        if (PyErr_Occurred())
            return -1;
        if (wanted_pos(&w, id, nr) >= 0)  /* one tensor passed twice: two edges to sum */
            return ONE_NODE_OTHER;
        w.id[w.n] = id;
        w.nr[w.n] = nr;
        w.pos[w.n++] = i;
    }
    PyObject *top = PyObject_GetAttr(out, s_grad_fn);
    if (top == NULL)
        return -1;
    if (top == Py_None) {
        Py_DECREF(top);
        return ONE_NODE_NONE;
    }
    PyObject *gf = Py_NewRef(top), *nexts = NULL, *slots = NULL;
    long long made_after = 0;
    int have_made = 0, split = 0, answer = -1;
    if (fold && is_reshape(nt, gf)) {  /* the output views back a product made here: hook the product's node */
        if ((nexts = nexts_of(gf)) == NULL)
            goto end;
        if (PyTuple_GET_SIZE(nexts) == 1) {
            PyObject *inner = PyTuple_GET_ITEM(PyTuple_GET_ITEM(nexts, 0), 0);
            int leaf;
            Py_ssize_t p = inner == Py_None ? 0
                           : edge_pos(nt, &w, inner, PyTuple_GET_ITEM(PyTuple_GET_ITEM(nexts, 0), 1), &leaf);
            if (p == -2)
                goto end;
            if (inner != Py_None && !leaf && p < 0) {
                if (made_after_of(state, edges, floor, &made_after) < 0)
                    goto end;
                have_made = 1;
                long long seq = sequence_nr(inner);
                if (seq == -1 && PyErr_Occurred())
                    goto end;
                if (seq > made_after) {
                    Py_INCREF(inner);
                    Py_SETREF(gf, inner);
                    split = 1;
                }
            }
        }
        Py_CLEAR(nexts);
    }
    if ((nexts = nexts_of(gf)) == NULL || (slots = PyList_New(0)) == NULL)
        goto end;
    for (Py_ssize_t slot = 0; slot < PyTuple_GET_SIZE(nexts); slot++) {
        PyObject *pair = PyTuple_GET_ITEM(nexts, slot), *nxt = PyTuple_GET_ITEM(pair, 0), *entry = NULL;
        if (nxt == Py_None)
            continue;
        int leaf;
        Py_ssize_t pos = edge_pos(nt, &w, nxt, PyTuple_GET_ITEM(pair, 1), &leaf);
        if (pos == -2)
            goto end;
        if (pos >= 0) {
            entry = Py_BuildValue("(nnO)", slot, pos, Py_False);
        } else if (!leaf) {
            if (!have_made && made_after_of(state, edges, floor, &made_after) < 0)
                goto end;
            have_made = 1;
            long long seq = sequence_nr(nxt);
            if (seq == -1 && PyErr_Occurred())
                goto end;
            if (seq <= made_after)
                continue;
            PyObject *steps = NULL;
            int got = fold ? input_chain(nt, &w, edges, nxt, made_after, &pos, &steps) : 0;
            if (got < 0)
                goto end;
            if (got) {
                entry = Py_BuildValue("(nnN)", slot, pos, steps);
            } else {
                int only = leaves_only(nt, &w, nxt);
                if (only < 0)
                    goto end;
                if (!only) {  /* a node made inside this call whose edges may reach the inputs too */
                    answer = ONE_NODE_OTHER;
                    goto end;
                }
                continue;
            }
        } else {
            continue;
        }
        if (entry == NULL || PyList_Append(slots, entry) < 0) {
            Py_XDECREF(entry);
            goto end;
        }
        Py_DECREF(entry);
    }
    Py_ssize_t n = PyList_GET_SIZE(slots);
    if (n != w.n || n == 0) {
        answer = ONE_NODE_OTHER;
        goto end;
    }
    for (Py_ssize_t i = 0; i < n; i++)  /* an input reached by two edges: to sum */
        for (Py_ssize_t j = i + 1; j < n; j++)
            if (PyLong_AsSsize_t(PyTuple_GET_ITEM(PyList_GET_ITEM(slots, i), 1))
                == PyLong_AsSsize_t(PyTuple_GET_ITEM(PyList_GET_ITEM(slots, j), 1))) {
                answer = ONE_NODE_OTHER;
                goto end;
            }
    if (raise_watermark(state, top) < 0 || (*slots_out = PyList_AsTuple(slots)) == NULL)
        goto end;
    *node_out = Py_NewRef(gf);
    *top_out = Py_NewRef(top);
    *split_out = split;
    answer = ONE_NODE_HOOK;
end:
    Py_XDECREF(nexts);
    Py_XDECREF(slots);
    Py_DECREF(gf);
    Py_DECREF(top);
    return answer;
}

/* backward._leaf_cast: 1 with *pos and *dtype (a new reference) when `node` (a ToCopyBackward0) only casts a
 * leaf input (`leaf`: id -> position); 0 when not; -1 on error */
static int leaf_cast(PyObject *node, PyObject *leaf, PyObject **pos, PyObject **dtype) {
    PyObject *nexts = nexts_of(node), *only = NULL, *var = NULL, *id = NULL;
    int got = -1;
    if (nexts == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(nexts); i++) {
        PyObject *n = PyTuple_GET_ITEM(PyTuple_GET_ITEM(nexts, i), 0);
        if (n == Py_None)
            continue;
        if (only != NULL) {  /* more than one */
            got = 0;
            goto end;
        }
        only = n;
    }
    got = 0;
    if (only == NULL)
        goto end;
    if ((var = PyObject_GetAttr(only, s_variable)) == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            got = -1;
            goto end;
        }
        PyErr_Clear();
        goto end;
    }
    if (var == Py_None)
        goto end;
    if ((id = PyLong_FromVoidPtr(var)) == NULL || (*pos = PyDict_GetItemWithError(leaf, id)) == NULL) {
        got = PyErr_Occurred() ? -1 : 0;
        goto end;
    }
    Py_INCREF(*pos);
    if ((*dtype = PyObject_GetAttr(var, s_dtype)) == NULL) {
        Py_CLEAR(*pos);
        got = -1;
        goto end;
    }
    got = 1;
end:
    Py_DECREF(nexts);
    Py_XDECREF(var);
    Py_XDECREF(id);
    return got;
}

PyObject *walk_edges(const NodeTypes *nt, PyObject *roots, PyObject *leaf, PyObject *nonleaf, long long floor,
                     Py_ssize_t max_nodes) {
    PyObject *seen = PyDict_New(), *todo = PySequence_List(roots), *edges = PyDict_New(), *cast_to = PyDict_New();
    PyObject *node = NULL, *nexts = NULL, *result = NULL;
    if (seen == NULL || todo == NULL || edges == NULL || cast_to == NULL)
        goto end;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(todo); i++) {
        PyObject *id = PyLong_FromVoidPtr(PyList_GET_ITEM(todo, i));
        int err = id == NULL || PyDict_SetItem(seen, id, PyList_GET_ITEM(todo, i)) < 0;
        Py_XDECREF(id);
        if (err)
            goto end;
    }
    int has_leaf = PyDict_GET_SIZE(leaf) > 0;
    while (PyList_GET_SIZE(todo) > 0) {
        Py_ssize_t last = PyList_GET_SIZE(todo) - 1;
        node = Py_NewRef(PyList_GET_ITEM(todo, last));
        if (PyList_SetSlice(todo, last, last + 1, NULL) < 0 || (nexts = nexts_of(node)) == NULL)
            goto end;
        for (Py_ssize_t slot = 0; slot < PyTuple_GET_SIZE(nexts); slot++) {
            PyObject *pair = PyTuple_GET_ITEM(nexts, slot), *nxt = PyTuple_GET_ITEM(pair, 0);
            PyObject *var = NULL, *key = NULL, *pos = NULL, *dtype = NULL, *nid = NULL;
            int err = 0;
            if (nxt == Py_None)
                continue;
            if (Py_TYPE(nxt) == (PyTypeObject *)nt->acc_grad) {
                if ((var = PyObject_GetAttr(nxt, s_variable)) == NULL)
                    goto end;
                if (var == Py_None)
                    Py_CLEAR(var);
            }
            if (var != NULL) {
                key = PyLong_FromVoidPtr(var);
                pos = key == NULL ? NULL : PyDict_GetItemWithError(leaf, key);
            } else {
                PyObject *gid = PyLong_FromVoidPtr(nxt);
                key = gid == NULL ? NULL : PyTuple_Pack(2, gid, PyTuple_GET_ITEM(pair, 1));
                Py_XDECREF(gid);
                pos = key == NULL ? NULL : PyDict_GetItemWithError(nonleaf, key);
            }
            Py_XINCREF(pos);
            err = key == NULL || PyErr_Occurred();
            if (!err && pos == NULL && has_leaf && Py_TYPE(nxt) == (PyTypeObject *)nt->to_copy) {
                int cast = leaf_cast(nxt, leaf, &pos, &dtype);
                err = cast < 0 || (cast > 0 && PyDict_SetItem(cast_to, pos, dtype) < 0);
            }
            if (!err && pos != NULL) {  /* edges.setdefault(id(node), (node, []))[1].append((slot, pos)) */
                PyObject *entry, *sp;
                err = (nid = PyLong_FromVoidPtr(node)) == NULL;
                if (!err && (entry = PyDict_GetItemWithError(edges, nid)) == NULL) {
                    PyObject *list = PyErr_Occurred() ? NULL : PyList_New(0);
                    entry = list == NULL ? NULL : PyTuple_Pack(2, node, list);
                    Py_XDECREF(list);
                    err = entry == NULL || PyDict_SetItem(edges, nid, entry) < 0;
                    Py_XDECREF(entry);  /* (the dict holds it) */
                }
                if (!err) {
                    sp = Py_BuildValue("(nO)", slot, pos);
                    err = sp == NULL || PyList_Append(PyTuple_GET_ITEM(entry, 1), sp) < 0;
                    Py_XDECREF(sp);
                }
            } else if (!err && var == NULL && PyDict_GET_SIZE(seen) < max_nodes) {
                err = (nid = PyLong_FromVoidPtr(nxt)) == NULL;
                int in = err ? -1 : PyDict_Contains(seen, nid);
                err = in < 0;
                if (!err && !in) {
                    long long seq = sequence_nr(nxt);
                    err = seq == -1 && PyErr_Occurred();
                    if (!err && seq > floor)
                        err = PyDict_SetItem(seen, nid, nxt) < 0 || PyList_Append(todo, nxt) < 0;
                }
            }
            Py_XDECREF(var);
            Py_XDECREF(key);
            Py_XDECREF(pos);
            Py_XDECREF(dtype);
            Py_XDECREF(nid);
            if (err)
                goto end;
        }
        Py_CLEAR(nexts);
        Py_CLEAR(node);
    }
    result = PyTuple_Pack(2, edges, cast_to);
end:
    Py_XDECREF(node);
    Py_XDECREF(nexts);
    Py_XDECREF(seen);
    Py_XDECREF(todo);
    Py_XDECREF(edges);
    Py_XDECREF(cast_to);
    return result;
}
