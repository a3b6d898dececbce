/* msprobe._call: CallCapture's flow (core/dump/call_capture.py) for one PyTorch API or module call in C,
 * where a session's filter takes every call and nothing is saved (pytorch/session.py decides, once a
 * session).
 * In the interpreter that flow is some 60 Python calls of glue around a few that do the work; here the
 * glue is C and the work is the same Python (or C) the flow calls:
 *
 *   key (counter) -> parent -> [tool work: stack -> input records -> before a mutation -> backward_begin]
 *     -> run (depth) -> [tool work: result_of -> output records -> emit -> backward_end] -> out
 *
 * CallPath(state, guard, tensor, parameter, counts, module_stack, filter, summarizer, recorder, quick, ops,
 *          with_stack, walk, keeps, limit, capture_stack, backward_of, backward, forward, back,
 *          graph: (is_grad_enabled, AccumulateGrad, TBackward0, ToCopyBackward0, reshaping node types) or None)
 * .call(s, prefix, name, func, args, kwargs, inplace, mutates) -> the call's result, as CallCapture.call
 * gives it for session `s` (its records, queue entries, counters, structure and stack entries, trackers);
 * .begin(s, key, parent, base, args, kwargs) -> a Frame and .end(s, frame, out, params): a module's call
 * as CallCapture.begin and end record it from its pre- and post-hook (`base`: its name in
 * `recorded_modules`; `params`: its `_parameters`). `call` is the same two halves around the run.
 * A plain tensor's record comes from `recorder` (msprobe._record, None: not built) and, where that hands
 * it back, from `quick` (the summarizer's record); None and Python scalars as value_record records them
 * (scalar_record, here); every other value from `s.value_record`, an output that is not a tensor, tuple or
 * list from `s.outputs_record`; a parameter that is not a plain tensor from `ops.param_record`;
 * before_mutation, result_of, backward_begin and backward_end are `ops`' (TorchCallOps) own, but their common
 * case (plain tensor arguments, one output made by one node: edges.c reads the graph) is done here, the node
 * hooked with a NodeHook; emit is the session's. Tool work is tool_work.py's: `state.busy` set and
 * a `guard` (DisableTorchFunction) entered. The objects handed over are the session's own (its counter's
 * dict, its module stack, ...), none of them the session: the session is handed to each call.
 *
 * PassOn, in front of the mode's Python handler: the calls the mode does not record, and the recorded ones
 * handed to `call` without that handler (see below). NodeHook: a OneNodeHook's firing (see below).
 * ModuleHook: a module's pre- and post-hook (modules.py's), their common case here (see below).
 * ParamGradHook: a parameter's post-accumulate-grad hook (modules.py's), its module's parameters_grad record
 * made here (see below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>

#include "edges.h"

static PyObject *s_busy, *s_depth, *s_hit, *s_in_optimizer, *s_share_forward, *s_defer_forward, *s_value_record,
    *s_outputs_record, *s_emit, *s_before_mutation, *s_result_of, *s_backward_begin, *s_backward_end, *s_enter,
    *s_exit, *s_input_args,
    *s_input_kwargs, *s_output, *s_optimizer, *s_param_record, *s_parameters, *s_recorded_modules,
    *s_fold_transposes, *s_weak_self, *s_register_hook, *s_register_prehook, *s_read_output, *s_requires_grad,
    *s_output_nr, *s_empty, *s_call_path, *s_session, *s_forward_active, *s_passes_everything,
    *s_parameters_attr, *s_dot_forward, *s_dot_backward, *s_module_stack_attr, *s_type, *s_value, *s_nan, *s_inf,
    *s_minus_inf, *s_float, *s_bool, *s_int, *s_str, *s_deferred, *s_slice, *s_ellipsis, *s_dots;

typedef struct {
    PyObject_HEAD
    PyObject *state, *guard, *tensor, *parameter, *counts, *module_stack, *filter, *summarizer, *recorder, *quick,
        *ops, *walk, *keeps, *limit, *capture_stack, *backward_of, *forward, *back, *grad_enabled;
    NodeTypes nt;  /* its tensor and parameter are the two above */
    int with_stack, backward, graph_reads;  /* graph_reads: the common case of backward_begin and _end in C */
    PyObject *enclosing, *bparent;  /* the last enclosing module key and its backward key (backward_of) */
} CallPath;

/* tool_work.__enter__ / __exit__ (`prev`: busy before, `guard`: the entered DisableTorchFunction) */
static int work_enter(CallPath *self, PyObject **prev, PyObject **guard) {
    *guard = NULL;
    if ((*prev = PyObject_GetAttr(self->state, s_busy)) == NULL)
        return -1;
    if (PyObject_SetAttr(self->state, s_busy, Py_True) < 0)
        goto fail;
    if ((*guard = PyObject_CallNoArgs(self->guard)) == NULL)
        goto restore;
    PyObject *r = PyObject_CallMethodNoArgs(*guard, s_enter);
    if (r == NULL) {
        Py_CLEAR(*guard);
        goto restore;
    }
    Py_DECREF(r);
    return 0;
restore:
    PyObject_SetAttr(self->state, s_busy, *prev);
fail:
    Py_CLEAR(*prev);
    return -1;
}

/* leaves an exception being raised as it is (a `with` block's exit) */
static int work_exit(CallPath *self, PyObject *prev, PyObject *guard) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = PyObject_CallMethodObjArgs(guard, s_exit, Py_None, Py_None, Py_None, NULL);
    int err = r == NULL || PyObject_SetAttr(self->state, s_busy, prev) < 0;
    Py_XDECREF(r);
    Py_DECREF(guard);
    Py_DECREF(prev);
    if (type != NULL) {
        PyErr_Clear();  /* (an error of the exit itself gives way to the one being raised) */
        PyErr_Restore(type, value, tb);
        return -1;
    }
    return err ? -1 : 0;
}

/* state.depth += delta */
static int add_depth(CallPath *self, long delta) {
    PyObject *d = PyObject_GetAttr(self->state, s_depth), *n = NULL, *by = NULL;
    int err = -1;
    if (d != NULL && (by = PyLong_FromLong(delta)) != NULL && (n = PyNumber_Add(d, by)) != NULL)
        err = PyObject_SetAttr(self->state, s_depth, n);
    Py_XDECREF(d);
    Py_XDECREF(by);
    Py_XDECREF(n);
    return err;
}

/* args_records' record of one value when nothing is saved: a plain tensor's from the summarizer (its C
 * path first), None's and a Python scalar's as DumpSession.value_record makes them, any other value's
 * from the session's value_record */
/* a plain tensor's record: the summarizer's C record first, else its Python record (`quick`), with
 * Summarizer.record's `shared` and `defer` */
static PyObject *plain_record(CallPath *self, PyObject *x, PyObject *shared, PyObject *defer) {
    if (self->recorder != Py_None) {
        PyObject *a[4] = {self->summarizer, x, shared, defer};
        PyObject *rec = PyObject_Vectorcall(self->recorder, a, 4, NULL);
        if (rec != Py_None)
            return rec;  /* (or NULL: an error) */
        Py_DECREF(rec);
    }
    PyObject *a[3] = {x, defer, shared};
    return PyObject_Vectorcall(self->quick, a, 3, NULL);
}

static PyObject *records_of(CallPath *self, PyObject *s, PyObject *seq, PyObject *const *forward,
                            PyObject *waits);

/* json_append.scalar_record of an exact int, float, bool or str: {"type": its type's name, "value": it}, a
 * float that is not finite as "nan", "inf" or "-inf" */
static PyObject *scalar_record(PyObject *x) {
    PyObject *value = x, *rec = PyDict_New();
    if (rec == NULL)
        return NULL;
    if (PyFloat_CheckExact(x)) {
        double d = PyFloat_AS_DOUBLE(x);
        if (!isfinite(d))
            value = d != d ? s_nan : d > 0 ? s_inf : s_minus_inf;
    }
    PyObject *name = PyFloat_CheckExact(x) ? s_float : PyBool_Check(x) ? s_bool : PyLong_CheckExact(x) ? s_int : s_str;
    if (PyDict_SetItem(rec, s_type, name) < 0 || PyDict_SetItem(rec, s_value, value) < 0) {
        Py_DECREF(rec);
        return NULL;
    }
    return rec;
}

/* records.common_value_record of a slice ({"type": "slice", "value": [start, stop, step]}, each an int or None
 * as it is, anything else as its str) or of Ellipsis ({"type": "ellipsis", "value": "..."}) */
static PyObject *index_record(PyObject *x) {
    PyObject *rec = PyDict_New(), *value = NULL;
    if (rec == NULL)
        return NULL;
    if (x == Py_Ellipsis) {
        value = Py_NewRef(s_dots);
    } else if ((value = PyList_New(3)) != NULL) {
        PySliceObject *sl = (PySliceObject *)x;
        PyObject *parts[3] = {sl->start, sl->stop, sl->step};
        for (int i = 0; i < 3; i++) {
            PyObject *p = parts[i], *v = p == Py_None || PyLong_Check(p) ? Py_NewRef(p) : PyObject_Str(p);
            if (v == NULL) {
                Py_CLEAR(value);
                break;
            }
            PyList_SET_ITEM(value, i, v);
        }
    }
    if (value == NULL || PyDict_SetItem(rec, s_type, x == Py_Ellipsis ? s_ellipsis : s_slice) < 0
        || PyDict_SetItem(rec, s_value, value) < 0) {
        Py_XDECREF(value);
        Py_DECREF(rec);
        return NULL;
    }
    Py_DECREF(value);
    return rec;
}

static PyObject *value_record(CallPath *self, PyObject *s, PyObject *x, PyObject *const *forward,
                              PyObject *waits) {
    if (Py_TYPE(x) == (PyTypeObject *)self->tensor || Py_TYPE(x) == (PyTypeObject *)self->parameter)
        return plain_record(self, x, forward[0], forward[1]);
    if (x == Py_None) {  /* value_record's next cases, without its frame: None, a Python scalar */
        Py_INCREF(x);
        return x;
    }
    if (is_scalar(x))
        return scalar_record(x);
    if (PySlice_Check(x) || x == Py_Ellipsis)
        return index_record(x);
    if (PyTuple_CheckExact(x) || PyList_CheckExact(x)) {  /* (not torch.Size: a record of its own) */
        if (Py_EnterRecursiveCall(" in a call's nested arguments"))
            return NULL;
        PyObject *recs = records_of(self, s, x, forward, waits);
        Py_LeaveRecursiveCall();
        return recs;
    }
    PyObject *a[5] = {s, x, Py_None, Py_False, waits};
    return PyObject_VectorcallMethod(s_value_record, a, 5, NULL);
}

/* the records of the items of a tuple or list */
static PyObject *records_of(CallPath *self, PyObject *s, PyObject *seq, PyObject *const *forward,
                            PyObject *waits) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = value_record(self, s, PySequence_Fast_GET_ITEM(seq, i), forward, waits);
        if (rec == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, rec);
    }
    return out;
}

/* One call between its begin and its end: CallCapture's CallFrame. `base`: a module's record name without
 * `.forward.{n}` (recorded_modules), NULL for an API call. */
struct frame {
    PyObject *key, *bkey, *bpar, *parent, *base, *stack, *forward[2], *waits, *in_args, *in_kwargs, *bstate;
    int inplace, module;
};

#define FRAME_FIELDS(f) {&(f)->key, &(f)->bkey, &(f)->bpar, &(f)->parent, &(f)->base, &(f)->stack, &(f)->forward[0], \
                         &(f)->forward[1], &(f)->waits, &(f)->in_args, &(f)->in_kwargs, &(f)->bstate}
#define N_FRAME_FIELDS 12

static void frame_clear(struct frame *f) {
    PyObject **all[N_FRAME_FIELDS] = FRAME_FIELDS(f);
    for (int i = 0; i < N_FRAME_FIELDS; i++)
        Py_CLEAR(*all[i]);
}

static PyObject *node_hook_make(PyObject *session, PyObject *key, PyObject *parent, Py_ssize_t n_in, Py_ssize_t out_nr,
                                PyObject *slots, int split);
static int attr_true(PyObject *obj, PyObject *name);
static PyTypeObject NodeHookType;

/* 1 when torch's grad mode is on, 0 off, -1 on error */
static int grad_on(CallPath *self) {
    PyObject *on = PyObject_CallNoArgs(self->grad_enabled);
    if (on == NULL)
        return -1;
    Py_DECREF(on);
    return on == Py_True;
}

/* 1 when no keyword argument is or holds a tensor (`dim=-1`, `keepdim=True`, `dtype=torch.float32`), 0 when one
 * may (a tensor, a list, tuple or dict), -1 on error */
static int no_tensors(CallPath *self, PyObject *kwargs) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    int plain = 1;
    while (plain == 1 && PyDict_Next(kwargs, &pos, &k, &v))
        plain = holds_no_tensor(&self->nt, v);
    return plain;
}

/* TorchCallOps.backward_begin's common case: positional arguments, each a plain tensor or a plain value, and
 * keyword arguments that hold no tensor. 1 with *state set (a new reference), 0 when the Python one decides,
 * -1 on error */
static int fast_backward_begin(CallPath *self, PyObject *args, PyObject *kwargs, int inplace, int module,
                               PyObject **state) {
    if (!self->graph_reads)
        return 0;
    int on = inplace ? 0 : grad_on(self);
    if (on <= 0) {  /* (with any arguments: no backward) */
        *state = on < 0 ? NULL : Py_NewRef(Py_None);
        return on < 0 ? -1 : 1;
    }
    int plain = no_tensors(self, kwargs);  /* (then its inputs are the positional arguments' tensors alone) */
    if (plain <= 0)
        return plain;
    if ((*state = begin_state(&self->nt, self->state, args, module)) == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return 1;
}

/* TorchCallOps.backward_end's common case: one plain tensor out of one node (edges.c's one_node), hooked
 * with a NodeHook as BackwardTracker._attach_one_node hooks it. 1 when done, 0 when the Python one decides
 * (it asks again), -1 on error */
static int fast_backward_end(CallPath *self, PyObject *s, PyObject *state, PyObject *key, PyObject *parent,
                             PyObject *out, int module) {
    if (!self->graph_reads
        || (Py_TYPE(out) != (PyTypeObject *)self->tensor && Py_TYPE(out) != (PyTypeObject *)self->parameter))
        return 0;
    if (!PyTuple_Check(state) || PyTuple_GET_SIZE(state) != 2)
        return 0;
    int on = grad_on(self);
    if (on <= 0)
        return on < 0 ? -1 : 1;
    if (!module) {
        PyObject *rg = PyObject_GetAttr(out, s_requires_grad);
        int needs = rg == NULL ? -1 : PyObject_IsTrue(rg);
        Py_XDECREF(rg);
        if (needs <= 0)
            return needs < 0 ? -1 : 1;  /* no node to hook */
    }
    int fold = attr_true(s, s_fold_transposes);
    if (fold < 0)
        return -1;
    PyObject *node = NULL, *top = NULL, *slots = NULL, *weak = NULL, *nr = NULL, *hook = NULL, *r = NULL;
    int split = 0, done = -1;
    PyObject *edges = PyTuple_GET_ITEM(state, 0);
    int how = one_node(&self->nt, self->state, edges, PyTuple_GET_ITEM(state, 1), out, fold, &node, &top, &slots,
                       &split);
    if (how != ONE_NODE_HOOK)
        return how == ONE_NODE_NONE ? 1 : how == ONE_NODE_OTHER ? 0 : -1;
    Py_ssize_t out_nr;
    if ((weak = PyObject_GetAttr(s, s_weak_self)) == NULL || (nr = PyObject_GetAttr(out, s_output_nr)) == NULL
        || ((out_nr = PyLong_AsSsize_t(nr)) == -1 && PyErr_Occurred()))
        goto end;
    if ((hook = node_hook_make(weak, key, parent, PyList_GET_SIZE(edges), out_nr, slots, split)) == NULL)
        goto end;
    if (split) {
        PyObject *read = PyObject_GetAttr(hook, s_read_output);
        r = read == NULL ? NULL : PyObject_CallMethodOneArg(top, s_register_prehook, read);
        Py_XDECREF(read);
        if (r == NULL)
            goto end;
        Py_CLEAR(r);
    }
    if ((r = PyObject_CallMethodOneArg(node, s_register_hook, hook)) == NULL)
        goto end;
    done = 1;
end:
    Py_XDECREF(node);
    Py_XDECREF(top);
    Py_XDECREF(slots);
    Py_XDECREF(weak);
    Py_XDECREF(nr);
    Py_XDECREF(hook);
    Py_XDECREF(r);
    return done;
}

/* CallCapture.begin when nothing is saved: `f` has its key, parent (and base) and, where backward records
 * are made, its backward key; `*args` (a tuple, owned) becomes the arguments to run it with. 0, or -1 on
 * error (tool work left as it was). */
static int frame_begin(CallPath *self, PyObject *s, struct frame *f, PyObject **args, PyObject *kwargs,
                       int mutates) {
    PyObject *prev = NULL, *guard = NULL, *r = NULL;
    if (work_enter(self, &prev, &guard) < 0)
        return -1;
    if (self->with_stack) {
        if (self->walk != Py_None) {
            PyObject *a[3] = {(PyObject *)PyEval_GetFrame(), self->keeps, self->limit};
            if (a[0] != NULL && (f->stack = PyObject_Vectorcall(self->walk, a, 3, NULL)) == Py_None)
                Py_CLEAR(f->stack);  /* a code not seen yet: capture_stack's Python walk notes it */
        }
        if (f->stack == NULL && !PyErr_Occurred())
            f->stack = PyObject_CallNoArgs(self->capture_stack);
        if (f->stack == NULL)
            goto fail;
    } else {
        f->stack = Py_None;
        Py_INCREF(f->stack);
    }
    /* a forward value's record: Summarizer.record's (shared, defer) when not told */
    if ((f->forward[0] = PyObject_GetAttr(self->summarizer, s_share_forward)) == NULL
        || (f->forward[1] = PyObject_GetAttr(self->summarizer, s_defer_forward)) == NULL
        || (f->waits = PyList_New(0)) == NULL
        || (f->in_args = records_of(self, s, *args, f->forward, f->waits)) == NULL
        || (f->in_kwargs = PyDict_New()) == NULL)
        goto fail;
    {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(kwargs, &pos, &k, &v)) {
            PyObject *rec = value_record(self, s, v, f->forward, f->waits);
            if (rec == NULL || PyDict_SetItem(f->in_kwargs, k, rec) < 0) {
                Py_XDECREF(rec);
                goto fail;
            }
            Py_DECREF(rec);
        }
    }
    if (f->inplace || mutates) {
        int waiting = attr_true(self->summarizer, s_deferred);  /* nothing waits: nothing to launch first */
        if (waiting < 0)
            goto fail;
        if (waiting) {
            PyObject *a[4] = {self->ops, s, *args, kwargs};
            if ((r = PyObject_VectorcallMethod(s_before_mutation, a, 4, NULL)) == NULL)
                goto fail;
            Py_CLEAR(r);
        }
    }
    if (self->backward) {
        /* the enclosing module's backward is the parent of this one's: a module's parent, an API call's
         * innermost module */
        Py_ssize_t nmod = PyList_GET_SIZE(self->module_stack);
        PyObject *enclosing = f->module ? f->parent : nmod > 0 ? PyList_GET_ITEM(self->module_stack, nmod - 1) : NULL;
        PyObject *bparent = Py_None;
        if (enclosing != NULL) {
            int truthy = PyObject_IsTrue(enclosing);
            if (truthy < 0)
                goto fail;
            if (truthy && enclosing != self->enclosing) {
                PyObject *got = PyObject_CallOneArg(self->backward_of, enclosing);
                if (got == NULL)
                    goto fail;
                Py_INCREF(enclosing);
                Py_XSETREF(self->enclosing, enclosing);
                Py_XSETREF(self->bparent, got);
            }
            if (truthy)
                bparent = self->bparent;
        }
        f->bpar = bparent;  /* held: the cache may change before backward_end */
        Py_INCREF(f->bpar);
        int fast = fast_backward_begin(self, *args, kwargs, f->inplace, f->module, &f->bstate);
        if (fast < 0)
            goto fail;
        if (fast)
            return work_exit(self, prev, guard);
        PyObject *a[9] = {self->ops, s, f->bkey, f->bpar, *args, kwargs, Py_False, f->inplace ? Py_True : Py_False,
                          f->module ? Py_True : Py_False};
        if ((r = PyObject_VectorcallMethod(s_backward_begin, a, 9, NULL)) == NULL)
            goto fail;
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2) {
            PyErr_SetString(PyExc_TypeError, "backward_begin returns (state, args)");
            goto fail;
        }
        f->bstate = PyTuple_GET_ITEM(r, 0);
        Py_INCREF(f->bstate);
        Py_SETREF(*args, PySequence_Tuple(PyTuple_GET_ITEM(r, 1)));
        Py_CLEAR(r);
        if (*args == NULL)
            goto fail;
    }
    return work_exit(self, prev, guard);
fail:
    Py_XDECREF(r);
    work_exit(self, prev, guard);
    return -1;
}

/* a module's parameter record (TorchCallOps.param_record when nothing is saved) */
static PyObject *param_record(CallPath *self, PyObject *s, PyObject *p, struct frame *f) {
    if (Py_TYPE(p) == (PyTypeObject *)self->tensor || Py_TYPE(p) == (PyTypeObject *)self->parameter)
        return plain_record(self, p, f->forward[0], Py_True);
    PyObject *a[6] = {self->ops, s, p, Py_None, Py_False, f->waits};
    return PyObject_VectorcallMethod(s_param_record, a, 6, NULL);
}

/* CallCapture.end when nothing is saved: `out` is what the call returned, `params` a module's
 * `_parameters` (None values left out) or NULL. Returns the output to hand on. */
static PyObject *frame_end(CallPath *self, PyObject *s, struct frame *f, PyObject *out, PyObject *args,
                           PyObject *params) {
    PyObject *prev = NULL, *guard = NULL, *res = NULL, *outs = NULL, *record = NULL, *precs = NULL, *result = NULL;
    if (work_enter(self, &prev, &guard) < 0)
        return NULL;
    if (f->inplace) {
        PyObject *a[5] = {self->ops, s, out, args, Py_True};
        if ((res = PyObject_VectorcallMethod(s_result_of, a, 5, NULL)) == NULL)
            goto end_work;
    } else {
        res = out;
        Py_INCREF(res);
    }
    if (params != NULL) {  /* (before the outputs, as CallCapture.end makes them) */
        Py_ssize_t pos = 0;
        PyObject *k, *p;
        if ((precs = PyDict_New()) == NULL)
            goto end_work;
        while (PyDict_Next(params, &pos, &k, &p)) {
            if (p == Py_None)
                continue;
            PyObject *rec = param_record(self, s, p, f);
            if (rec == NULL || PyDict_SetItem(precs, k, rec) < 0) {
                Py_XDECREF(rec);
                goto end_work;
            }
            Py_DECREF(rec);
        }
    }
    /* outputs_record when nothing is saved: one tensor, a list or tuple of values, else the session's */
    if (Py_TYPE(res) == (PyTypeObject *)self->tensor || Py_TYPE(res) == (PyTypeObject *)self->parameter) {
        PyObject *rec = value_record(self, s, res, f->forward, f->waits);
        if (rec == NULL || (outs = PyList_New(1)) == NULL) {
            Py_XDECREF(rec);
            goto end_work;
        }
        PyList_SET_ITEM(outs, 0, rec);
    } else if (PyTuple_CheckExact(res) || PyList_CheckExact(res)) {
        if ((outs = records_of(self, s, res, f->forward, f->waits)) == NULL)
            goto end_work;
    } else {
        PyObject *a[5] = {s, f->key, res, Py_False, f->waits};
        if ((outs = PyObject_VectorcallMethod(s_outputs_record, a, 5, NULL)) == NULL)
            goto end_work;
    }
    if ((record = PyDict_New()) == NULL || PyDict_SetItem(record, s_input_args, f->in_args) < 0
        || PyDict_SetItem(record, s_input_kwargs, f->in_kwargs) < 0 || PyDict_SetItem(record, s_output, outs) < 0
        || (precs != NULL && PyDict_SetItem(record, s_parameters, precs) < 0))
        goto end_work;
    {
        /* its construct.json and stack.json entries ride in the record's queue entry */
        PyObject *a[8] = {s, f->key, record, f->waits, outs, Py_None, f->parent, f->stack};
        PyObject *e = PyObject_VectorcallMethod(s_emit, a, 8, NULL);
        if (e == NULL)
            goto end_work;
        Py_DECREF(e);
    }
    if (f->module) {  /* its parameters' gradients are recorded */
        PyObject *modules = PyObject_GetAttr(s, s_recorded_modules);
        int err = modules == NULL || PySet_Add(modules, f->base) < 0;
        Py_XDECREF(modules);
        if (err)
            goto end_work;
    }
    Py_INCREF(out);
    if (f->bstate != NULL && f->bstate != Py_None) {
        int fast = fast_backward_end(self, s, f->bstate, f->bkey, f->bpar, out, f->module);
        if (fast < 0) {
            Py_DECREF(out);
            goto end_work;
        }
        if (!fast) {
            PyObject *a[10] = {self->ops, s, f->bstate, f->bkey, f->bpar, out, res, Py_False,
                               f->inplace ? Py_True : Py_False, f->module ? Py_True : Py_False};
            PyObject *got = PyObject_VectorcallMethod(s_backward_end, a, 10, NULL);
            Py_DECREF(out);
            if (got == NULL)
                goto end_work;
            out = got;
        }
    }
    result = out;
end_work:
    if (work_exit(self, prev, guard) < 0)
        Py_CLEAR(result);
    Py_XDECREF(res);
    Py_XDECREF(outs);
    Py_XDECREF(record);
    Py_XDECREF(precs);
    return result;
}

/* state.depth += 1; func(*args, **kwargs); state.depth -= 1 (calls it makes itself are nested, not recorded) */
static PyObject *run_nested(CallPath *self, PyObject *func, PyObject *args, PyObject *kwargs) {
    if (add_depth(self, 1) < 0)
        return NULL;
    PyObject *out = PyObject_Call(func, args, PyDict_GET_SIZE(kwargs) ? kwargs : NULL);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int err = add_depth(self, -1);
    if (type != NULL) {
        if (err < 0)
            PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    if (err < 0)
        Py_CLEAR(out);
    return out;
}

/* Keys made once and handed out again: a module or an API called as the n-th of its name in one step is
 * called so in the next, so its key strings ("{base}.forward.{n}" ...) are kept in lists indexed by n (the
 * first KEYS_KEPT of each name) instead of formatted at every call. */
#define KEYS_KEPT 64

/* kept[i] as a new reference, or NULL (no error set) when it was not made yet */
static PyObject *kept_key(PyObject *kept, Py_ssize_t i) {
    if (i < PyList_GET_SIZE(kept)) {
        PyObject *k = PyList_GET_ITEM(kept, i);
        if (k != Py_None)
            return Py_NewRef(k);
    }
    return NULL;
}

/* `key` (a new reference, or NULL on error: passed on) kept as kept[i] when i is below KEYS_KEPT */
static PyObject *keep_key(PyObject *kept, Py_ssize_t i, PyObject *key) {
    if (key == NULL || i < 0 || i >= KEYS_KEPT)
        return key;
    while (PyList_GET_SIZE(kept) <= i)
        if (PyList_Append(kept, Py_None) < 0) {
            Py_DECREF(key);
            return NULL;
        }
    PyList_SetItem(kept, i, Py_NewRef(key));  /* (steals the new reference; the old item was None) */
    return key;
}

/* an API's kept keys: api_names[prefix][name] = [counted "prefix.name", forward keys, backward keys, the
 * forward and backward suffixes they were made with]; process-wide, as the APIs' names are */
static PyObject *api_names;

static PyObject *api_entry(CallPath *self, PyObject *prefix, PyObject *name) {
    PyObject *names = PyDict_GetItemWithError(api_names, prefix), *entry;
    if (names == NULL) {
        if (PyErr_Occurred() || (names = PyDict_New()) == NULL)
            return NULL;
        int err = PyDict_SetItem(api_names, prefix, names);
        Py_DECREF(names);  /* (the table holds it) */
        if (err < 0)
            return NULL;
    }
    entry = PyDict_GetItemWithError(names, name);
    if (entry != NULL && PyList_GET_ITEM(entry, 3) == self->forward && PyList_GET_ITEM(entry, 4) == self->back)
        return entry;  /* (borrowed: the table holds it) */
    if (PyErr_Occurred())
        return NULL;
    PyObject *counted = PyUnicode_FromFormat("%U.%U", prefix, name);
    if (counted == NULL)
        return NULL;
    entry = Py_BuildValue("[N[][]OO]", counted, self->forward, self->back);
    if (entry == NULL || PyDict_SetItem(names, name, entry) < 0) {
        Py_XDECREF(entry);
        return NULL;
    }
    Py_DECREF(entry);
    return entry;
}

static PyObject *call(CallPath *self, PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "call(s, prefix, name, func, args, kwargs, inplace, mutates)");
        return NULL;
    }
    PyObject *s = argv[0], *prefix = argv[1], *name = argv[2], *func = argv[3], *kwargs = argv[5];
    int inplace = PyObject_IsTrue(argv[6]), mutates = PyObject_IsTrue(argv[7]);
    if (inplace < 0 || mutates < 0)
        return NULL;
    if (!PyUnicode_Check(prefix) || !PyUnicode_Check(name) || !PyDict_Check(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "call: prefix and name are str, kwargs a dict");
        return NULL;
    }
    struct frame f = {0};
    f.inplace = inplace;
    PyObject *result = NULL, *counted = NULL, *count = NULL, *next = NULL, *args = NULL, *out = NULL;
    Py_ssize_t n = 0;

    /* key: CallCounter.next_api_key (naming.api_key's layout; its backward key is backward_of's) */
    PyObject *entry = api_entry(self, prefix, name);
    if (entry == NULL)
        return NULL;
    Py_INCREF(entry);  /* (held: another call may replace it in the table while this one runs) */
    counted = Py_NewRef(PyList_GET_ITEM(entry, 0));
    count = PyDict_GetItemWithError(self->counts, counted);
    if (count == NULL && PyErr_Occurred())
        goto done;
    if (count != NULL && (n = PyLong_AsSsize_t(count)) == -1 && PyErr_Occurred())
        goto done;
    count = NULL;  /* (borrowed) */
    if ((next = PyLong_FromSsize_t(n + 1)) == NULL || PyDict_SetItem(self->counts, counted, next) < 0
        || ((f.key = kept_key(PyList_GET_ITEM(entry, 1), n)) == NULL
            && (f.key = keep_key(PyList_GET_ITEM(entry, 1), n,
                                 PyUnicode_FromFormat("%U.%zd.%U", counted, n, self->forward))) == NULL)
        || (self->backward && (f.bkey = kept_key(PyList_GET_ITEM(entry, 2), n)) == NULL
            && (f.bkey = keep_key(PyList_GET_ITEM(entry, 2), n,
                                  PyUnicode_FromFormat("%U.%zd.%U", counted, n, self->back))) == NULL)
        || PyObject_SetAttr(self->filter, s_hit, Py_True) < 0)  /* (passes_everything: want_call's answer) */
        goto done;

    /* parent: DumpSession.parent_key, without its frame */
    Py_ssize_t nmod = PyList_GET_SIZE(self->module_stack);
    if (nmod > 0) {
        f.parent = PyList_GET_ITEM(self->module_stack, nmod - 1);
        Py_INCREF(f.parent);
    } else {
        PyObject *flag = PyObject_GetAttr(s, s_in_optimizer);
        int t = flag == NULL ? -1 : PyObject_IsTrue(flag);
        Py_XDECREF(flag);
        if (t < 0)
            goto done;
        f.parent = t ? s_optimizer : Py_None;
        Py_INCREF(f.parent);
    }
    if ((args = PySequence_Tuple(argv[4])) == NULL || frame_begin(self, s, &f, &args, kwargs, mutates) < 0
        || (out = run_nested(self, func, args, kwargs)) == NULL)
        goto done;
    result = frame_end(self, s, &f, out, args, NULL);
done:
    frame_clear(&f);
    Py_DECREF(entry);
    Py_XDECREF(counted);
    Py_XDECREF(next);
    Py_XDECREF(args);
    Py_XDECREF(out);
    return result;
}

/* A module's call between its pre-hook (CallPath.begin) and its post-hook (CallPath.end). */
typedef struct {
    PyObject_HEAD
    struct frame f;
    int ended;  /* (a Frame reaches Python only once begun: the type has no tp_new) */
} Frame;

static int frameobj_traverse(Frame *self, visitproc visit, void *arg) {
    PyObject **all[N_FRAME_FIELDS] = FRAME_FIELDS(&self->f);
    for (int i = 0; i < N_FRAME_FIELDS; i++)
        Py_VISIT(*all[i]);
    return 0;
}

static int frameobj_clear(Frame *self) {
    frame_clear(&self->f);
    return 0;
}

static void frameobj_dealloc(Frame *self) {
    PyObject_GC_UnTrack(self);
    frame_clear(&self->f);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject FrameType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe._call.Frame",
    .tp_basicsize = sizeof(Frame),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A module's call between CallPath.begin and CallPath.end.",
    .tp_traverse = (traverseproc)frameobj_traverse,
    .tp_clear = (inquiry)frameobj_clear,
    .tp_dealloc = (destructor)frameobj_dealloc,
};

/* the frame of module call `key` (CallCapture.begin, module); `bkey`: its backward key (NULL: backward_of's) */
static PyObject *module_begin(CallPath *self, PyObject *s, PyObject *key, PyObject *bkey, PyObject *parent,
                              PyObject *base, PyObject *args_in, PyObject *kwargs) {
    PyObject *args = PySequence_Tuple(args_in);
    if (args == NULL)
        return NULL;
    Frame *fr = PyObject_GC_New(Frame, &FrameType);
    if (fr == NULL) {
        Py_DECREF(args);
        return NULL;
    }
    memset(&fr->f, 0, sizeof(fr->f));
    fr->ended = 0;
    PyObject_GC_Track(fr);
    struct frame *f = &fr->f;
    f->module = 1;
    f->key = Py_NewRef(key);
    f->parent = Py_NewRef(parent);
    f->base = Py_NewRef(base);
    if (self->backward)
        f->bkey = bkey != NULL ? Py_NewRef(bkey) : PyObject_CallOneArg(self->backward_of, key);
    if ((self->backward && f->bkey == NULL) || PyObject_SetAttr(self->filter, s_hit, Py_True) < 0
        || frame_begin(self, s, f, &args, kwargs, 0) < 0) {
        Py_XDECREF(args);
        Py_DECREF(fr);
        return NULL;
    }
    Py_DECREF(args);
    return (PyObject *)fr;
}

/* begin(s, key, parent, base, args, kwargs) -> the frame of module call `key` (CallCapture.begin, module) */
static PyObject *begin(CallPath *self, PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs != 6 || !PyDict_Check(argv[5])) {
        PyErr_SetString(PyExc_TypeError, "begin(s, key, parent, base, args, kwargs: dict)");
        return NULL;
    }
    return module_begin(self, argv[0], argv[1], NULL, argv[2], argv[3], argv[4], argv[5]);
}

static PyObject *module_end(CallPath *self, PyObject *s, Frame *fr, PyObject *out, PyObject *params) {
    if (fr->ended) {
        PyErr_SetString(PyExc_RuntimeError, "end: a frame ended already");
        return NULL;
    }
    fr->ended = 1;
    return frame_end(self, s, &fr->f, out, s_empty, params);
}

/* end(s, frame, out, params) -> out as handed on (CallCapture.end of a module; `params`: its
 * `_parameters`, None values left out) */
static PyObject *end(CallPath *self, PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs != 4 || Py_TYPE(argv[1]) != &FrameType || !PyDict_Check(argv[3])) {
        PyErr_SetString(PyExc_TypeError, "end(s, frame: Frame, out, params: dict)");
        return NULL;
    }
    return module_end(self, argv[0], (Frame *)argv[1], argv[2], argv[3]);
}

#define N_HELD 23

static PyObject **held(CallPath *self, int i) {
    PyObject **all[N_HELD] = {&self->state, &self->guard, &self->tensor, &self->parameter, &self->counts,
                              &self->module_stack, &self->filter, &self->summarizer, &self->recorder, &self->quick,
                              &self->ops, &self->walk, &self->keeps, &self->limit, &self->capture_stack,
                              &self->backward_of, &self->forward, &self->back, &self->grad_enabled,
                              &self->nt.acc_grad, &self->nt.transpose, &self->nt.to_copy, &self->nt.reshapes};
    return all[i];
}

static PyObject *callpath_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    CallPath *self = (CallPath *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    PyObject *graph;
    if (!PyArg_ParseTuple(args, "OO!O!O!O!O!OOOOOpOO!OOOpUUO:CallPath", &self->state, &PyType_Type,
                          &self->guard, &PyType_Type, &self->tensor, &PyType_Type, &self->parameter, &PyDict_Type,
                          &self->counts, &PyList_Type, &self->module_stack, &self->filter, &self->summarizer,
                          &self->recorder, &self->quick, &self->ops, &self->with_stack, &self->walk, &PyDict_Type,
                          &self->keeps, &self->limit, &self->capture_stack, &self->backward_of, &self->backward,
                          &self->forward, &self->back, &graph)
        || (graph != Py_None
            && !PyArg_ParseTuple(graph, "OO!O!O!O!:CallPath's graph", &self->grad_enabled, &PyType_Type,
                                 &self->nt.acc_grad, &PyType_Type, &self->nt.transpose, &PyType_Type,
                                 &self->nt.to_copy, &PyTuple_Type, &self->nt.reshapes))) {
        for (int i = 0; i < N_HELD; i++)
            *held(self, i) = NULL;
        Py_DECREF(self);
        return NULL;
    }
    self->graph_reads = graph != Py_None;
    if (!self->graph_reads)  /* backward.py decides every call's hooks */
        self->grad_enabled = self->nt.acc_grad = self->nt.transpose = self->nt.to_copy = self->nt.reshapes = Py_None;
    for (int i = 0; i < N_HELD; i++)
        Py_INCREF(*held(self, i));
    self->nt.tensor = self->tensor;
    self->nt.parameter = self->parameter;
    return (PyObject *)self;
}

static int callpath_traverse(CallPath *self, visitproc visit, void *arg) {
    for (int i = 0; i < N_HELD; i++)
        Py_VISIT(*held(self, i));
    Py_VISIT(self->enclosing);
    Py_VISIT(self->bparent);
    return 0;
}

static int callpath_clear(CallPath *self) {
    for (int i = 0; i < N_HELD; i++)
        Py_CLEAR(*held(self, i));
    Py_CLEAR(self->enclosing);
    Py_CLEAR(self->bparent);
    return 0;
}

static void callpath_dealloc(CallPath *self) {
    PyObject_GC_UnTrack(self);
    callpath_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef callpath_methods[] = {
    {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL,
     "call(s, prefix, name, func, args, kwargs, inplace, mutates) -> the result of func(*args, **kwargs), "
     "recorded as CallCapture.call records it."},
    {"begin", (PyCFunction)(void (*)(void))begin, METH_FASTCALL,
     "begin(s, key, parent, base, args, kwargs) -> the frame of a module's call, begun as CallCapture.begin "
     "begins it."},
    {"end", (PyCFunction)(void (*)(void))end, METH_FASTCALL,
     "end(s, frame, out, params) -> out, the module's call recorded as CallCapture.end records it."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CallPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe._call.CallPath",
    .tp_basicsize = sizeof(CallPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "CallCapture's flow for one session's API and module calls (see the module source).",
    .tp_new = callpath_new,
    .tp_traverse = (traverseproc)callpath_traverse,
    .tp_clear = (inquiry)callpath_clear,
    .tp_dealloc = (destructor)callpath_dealloc,
    .tp_methods = callpath_methods,
};

/* ModuleHook(capture, state, base, frames, graph_task, slow, post): one module's forward pre-hook (post
 * false) or forward hook (post true), as ModuleCapture's Python hooks (`slow`, same arguments) record it,
 * for the common case: a session with a CallPath, forward capture on, no tool work, no nesting, outside
 * autograd's engine (graph_task() == -1). Any other case is `slow`'s. The pre-hook counts the call, pushes its
 * key on the module stack and begins its frame; the post-hook pops them and ends it. `frames` is the
 * capture's list of (key, parent, frame or None) shared with `slow`, so either may begin what the other ends. */
typedef struct {
    PyObject_HEAD
    PyObject *capture, *state, *base, *frames, *graph_task, *slow, *fkey, *bkey;  /* fkey/bkey: "{base}.forward." */
    PyObject *fkeys, *bkeys;  /* the keys made so far, by index (kept_key) */
    int post;
    vectorcallfunc vectorcall;
} ModuleHook;

/* the session's CallPath when the pre-hook may record in C (a new reference), Py_None when `slow` decides,
 * NULL on error */
static PyObject *hook_path(ModuleHook *self, PyObject *s) {
    PyObject *path = NULL, *v;
    int quiet;
    if (s == Py_None)
        return Py_NewRef(Py_None);
    if ((quiet = attr_true(self->capture, s_forward_active)) < 0)
        return NULL;
    if (!quiet)
        return Py_NewRef(Py_None);
    /* state.busy or state.depth: tool work, or a call inside a recorded one */
    if ((quiet = attr_true(self->state, s_busy)) < 0 || (!quiet && (quiet = attr_true(self->state, s_depth)) < 0))
        return NULL;
    if (quiet)
        return Py_NewRef(Py_None);
    if ((v = PyObject_CallNoArgs(self->graph_task)) == NULL)
        return NULL;
    long task = PyLong_AsLong(v);
    Py_DECREF(v);
    if (task == -1 && PyErr_Occurred())
        return NULL;
    if (task != -1)  /* in backward: a checkpoint's recomputation, maybe */
        return Py_NewRef(Py_None);
    if ((path = PyObject_GetAttr(s, s_call_path)) == NULL)
        return NULL;
    if (Py_TYPE(path) != &CallPathType) {
        Py_DECREF(path);
        return Py_NewRef(Py_None);
    }
    if ((quiet = attr_true(((CallPath *)path)->filter, s_passes_everything)) <= 0) {
        Py_DECREF(path);
        return quiet < 0 ? NULL : Py_NewRef(Py_None);
    }
    return path;
}

static PyObject *module_hook_pre(ModuleHook *self, PyObject *const *args) {
    PyObject *s = PyObject_GetAttr(self->state, s_session), *path = NULL, *n = NULL, *key = NULL,
             *bkey = NULL, *frame = NULL, *entry = NULL, *result = NULL;
    if (s == NULL || (path = hook_path(self, s)) == NULL)
        goto end;
    if (path == Py_None) {
        result = PyObject_Vectorcall(self->slow, args, 3, NULL);
        goto end;
    }
    CallPath *cp = (CallPath *)path;
    if (!PyDict_Check(args[2])) {
        result = PyObject_Vectorcall(self->slow, args, 3, NULL);
        goto end;
    }
    /* the counter (a defaultdict(int): no default asked for, in place) */
    PyObject *got = PyDict_GetItemWithError(cp->counts, self->base);
    if (got == NULL && PyErr_Occurred())
        goto end;
    Py_ssize_t count = got == NULL ? 0 : PyLong_AsSsize_t(got);
    if (count == -1 && PyErr_Occurred())
        goto end;
    if ((n = PyLong_FromSsize_t(count + 1)) == NULL || PyDict_SetItem(cp->counts, self->base, n) < 0)
        goto end;
    if (((key = kept_key(self->fkeys, count)) == NULL
         && (key = keep_key(self->fkeys, count, PyUnicode_FromFormat("%U%zd", self->fkey, count))) == NULL)
        || (cp->backward && (bkey = kept_key(self->bkeys, count)) == NULL
            && (bkey = keep_key(self->bkeys, count, PyUnicode_FromFormat("%U%zd", self->bkey, count))) == NULL))
        goto end;
    Py_ssize_t depth = PyList_GET_SIZE(cp->module_stack);
    PyObject *parent = depth ? PyList_GET_ITEM(cp->module_stack, depth - 1) : Py_None;
    Py_INCREF(parent);
    if (PyList_Append(cp->module_stack, key) < 0
        || (frame = module_begin(cp, s, key, bkey, parent, self->base, args[1], args[2])) == NULL
        || (entry = PyTuple_Pack(3, key, parent, frame)) == NULL || PyList_Append(self->frames, entry) < 0) {
        Py_DECREF(parent);
        goto end;
    }
    Py_DECREF(parent);
    result = Py_NewRef(Py_None);
end:
    Py_XDECREF(s);
    Py_XDECREF(path);
    Py_XDECREF(n);
    Py_XDECREF(key);
    Py_XDECREF(bkey);
    Py_XDECREF(frame);
    Py_XDECREF(entry);
    return result;
}

static PyObject *module_hook_post(ModuleHook *self, PyObject *const *args) {
    Py_ssize_t n = PyList_GET_SIZE(self->frames);
    if (n == 0)
        return Py_NewRef(Py_None);
    PyObject *entry = PyList_GET_ITEM(self->frames, n - 1);
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3
        || Py_TYPE(PyTuple_GET_ITEM(entry, 2)) != &FrameType)  /* the slow hook's to end */
        return PyObject_Vectorcall(self->slow, args, 4, NULL);
    Py_INCREF(entry);
    PyObject *result = NULL, *path = NULL, *params = NULL;
    if (PyList_SetSlice(self->frames, n - 1, n, NULL) < 0)
        goto end;
    PyObject *s = PyObject_GetAttr(self->state, s_session);
    if (s == NULL)
        goto end;
    if (s != Py_None) {
        PyObject *key = PyTuple_GET_ITEM(entry, 0), *stack = PyObject_GetAttr(s, s_module_stack_attr);
        if (stack == NULL)
            goto end_s;
        Py_ssize_t depth = PyList_Check(stack) ? PyList_GET_SIZE(stack) : 0;
        int top = depth ? PyObject_RichCompareBool(PyList_GET_ITEM(stack, depth - 1), key, Py_EQ) : 0;
        if (top < 0 || (top && PyList_SetSlice(stack, depth - 1, depth, NULL) < 0)) {
            Py_DECREF(stack);
            goto end_s;
        }
        Py_DECREF(stack);
        if ((path = PyObject_GetAttr(s, s_call_path)) == NULL)
            goto end_s;
        if (Py_TYPE(path) == &CallPathType) {  /* (else a session begun since: the call is dropped) */
            if ((params = PyObject_GetAttr(args[0], s_parameters_attr)) == NULL)
                goto end_s;
            if (!PyDict_Check(params)) {
                PyErr_SetString(PyExc_TypeError, "a module's _parameters is not a dict");
                goto end_s;
            }
            PyObject *out = module_end((CallPath *)path, s, (Frame *)PyTuple_GET_ITEM(entry, 2), args[3], params);
            if (out == NULL)
                goto end_s;
            Py_DECREF(out);
        }
    }
    result = Py_NewRef(Py_None);
end_s:
    Py_DECREF(s);
end:
    Py_DECREF(entry);
    Py_XDECREF(path);
    Py_XDECREF(params);
    return result;
}

static PyObject *module_hook_call(ModuleHook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != (self->post ? 4 : 3))
        return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
    return self->post ? module_hook_post(self, args) : module_hook_pre(self, args);
}

static PyObject *module_hook_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    ModuleHook *self = (ModuleHook *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (!PyArg_ParseTuple(args, "OOUO!OOp:ModuleHook", &self->capture, &self->state, &self->base, &PyList_Type,
                          &self->frames, &self->graph_task, &self->slow, &self->post)) {
        self->capture = self->state = self->base = self->frames = self->graph_task = self->slow = NULL;
        Py_DECREF(self);
        return NULL;
    }
    Py_INCREF(self->capture);
    Py_INCREF(self->state);
    Py_INCREF(self->base);
    Py_INCREF(self->frames);
    Py_INCREF(self->graph_task);
    Py_INCREF(self->slow);
    /* the keys naming.py makes: "{base}.forward.{n}" and its backward_of, "{base}.backward.{n}" */
    if ((self->fkey = PyUnicode_Concat(self->base, s_dot_forward)) == NULL
        || (self->bkey = PyUnicode_Concat(self->base, s_dot_backward)) == NULL
        || (self->fkeys = PyList_New(0)) == NULL || (self->bkeys = PyList_New(0)) == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->vectorcall = (vectorcallfunc)module_hook_call;
    return (PyObject *)self;
}

static int module_hook_traverse(ModuleHook *self, visitproc visit, void *arg) {
    Py_VISIT(self->capture);
    Py_VISIT(self->state);
    Py_VISIT(self->frames);
    Py_VISIT(self->graph_task);
    Py_VISIT(self->slow);
    return 0;
}

static int module_hook_clear(ModuleHook *self) {
    Py_CLEAR(self->capture);
    Py_CLEAR(self->state);
    Py_CLEAR(self->base);
    Py_CLEAR(self->frames);
    Py_CLEAR(self->graph_task);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->fkey);
    Py_CLEAR(self->bkey);
    Py_CLEAR(self->fkeys);
    Py_CLEAR(self->bkeys);
    return 0;
}

static void module_hook_dealloc(ModuleHook *self) {
    PyObject_GC_UnTrack(self);
    module_hook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject ModuleHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe._call.ModuleHook",
    .tp_basicsize = sizeof(ModuleHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A module's forward pre-hook or hook: the common case in C, every other the Python hook's.",
    .tp_new = module_hook_new,
    .tp_traverse = (traverseproc)module_hook_traverse,
    .tp_clear = (inquiry)module_hook_clear,
    .tp_dealloc = (destructor)module_hook_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ModuleHook, vectorcall),
};

/* 1 when attribute `name` of `obj` is true; 0 false; -1 on error */
static int attr_true(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int truth = PyObject_IsTrue(v);
    Py_DECREF(v);
    return truth;
}

/* ParamGradHook(state, name, mstate, slow): the post-accumulate-grad hook of parameter `name` of a module
 * (modules.py's _ParamGradState.hook), its common case in C: with the session's CallPath, the gradient is
 * noted in `state.got` and, once the module's last one came, its parameters_grad record made as
 * DumpSession.emit_params_grad makes it (key from `state.stem` and the counter of `state.counted`, plain
 * tensors' records from the C record, emit, the launch queued for the backward's end when summaries wait),
 * inside tool work; a gradient that is not a plain tensor goes to emit_params_grad itself. Without a CallPath
 * (the Python flow) the Python hook `slow` does it all. `mstate` is msprobe.pytorch._state. */
typedef struct {
    PyObject_HEAD
    PyObject *state, *name, *mstate, *slow;
    vectorcallfunc vectorcall;
} ParamGradHook;

static PyObject *s_owner, *s_grads_active, *s_got, *s_names, *s_base, *s_counted, *s_stem, *s_grad,
    *s_launch_queued, *s_launch_at_backward_end, *s_emit_params_grad;

/* the module's parameters_grad record, its gradients `grads` (name -> gradient, in the module's order) */
static PyObject *params_grad_emit(CallPath *cp, PyObject *s, PyObject *state, PyObject *base, PyObject *grads) {
    PyObject *prev = NULL, *guard = NULL, *counted = NULL, *stem = NULL, *key = NULL, *record = NULL, *next = NULL,
             *r = NULL, *k, *g;
    Py_ssize_t pos = 0;
    if (work_enter(cp, &prev, &guard) < 0)
        return NULL;
    if (!cp->backward) {  /* (the filter leaves backward out; a CallPath means no overflow gate) */
        r = Py_NewRef(Py_None);
        goto work;
    }
    while (PyDict_Next(grads, &pos, &k, &g))
        if (g != Py_None && Py_TYPE(g) != (PyTypeObject *)cp->tensor && Py_TYPE(g) != (PyTypeObject *)cp->parameter) {
            PyObject *a[3] = {s, base, grads};  /* a subclass (a DTensor's shard): tensor_record's case */
            r = PyObject_VectorcallMethod(s_emit_params_grad, a, 3, NULL);
            goto work;
        }
    if ((counted = PyObject_GetAttr(state, s_counted)) == NULL || (stem = PyObject_GetAttr(state, s_stem)) == NULL)
        goto work;
    PyObject *got = PyDict_GetItemWithError(cp->counts, counted);  /* (a defaultdict(int): in place) */
    if (got == NULL && PyErr_Occurred())
        goto work;
    Py_ssize_t n = got == NULL ? 0 : PyLong_AsSsize_t(got);
    if ((n == -1 && PyErr_Occurred()) || (next = PyLong_FromSsize_t(n + 1)) == NULL
        || PyDict_SetItem(cp->counts, counted, next) < 0 || (key = PyUnicode_FromFormat("%U%zd", stem, n)) == NULL
        || (record = PyDict_New()) == NULL)
        goto work;
    pos = 0;
    while (PyDict_Next(grads, &pos, &k, &g)) {
        /* deferred at every level (see the session's emit_params_grad) */
        PyObject *rec = g == Py_None ? Py_NewRef(Py_None) : plain_record(cp, g, Py_False, Py_True);
        PyObject *one = rec == NULL ? NULL : PyList_New(1);
        if (one == NULL) {
            Py_XDECREF(rec);
            goto work;
        }
        PyList_SET_ITEM(one, 0, rec);
        int err = PyDict_SetItem(record, k, one);
        Py_DECREF(one);
        if (err < 0)
            goto work;
    }
    {
        PyObject *a[3] = {s, key, record};
        if ((r = PyObject_VectorcallMethod(s_emit, a, 3, NULL)) == NULL)
            goto work;
    }
    /* summaries waiting for a batch: launched as this backward pass ends (_launch_at_backward_end) */
    int waiting = attr_true(cp->summarizer, s_deferred), queued = waiting > 0 ? attr_true(s, s_launch_queued) : 0;
    if (waiting < 0 || queued < 0)
        Py_CLEAR(r);
    else if (waiting && !queued) {
        Py_DECREF(r);
        r = PyObject_CallMethodNoArgs(s, s_launch_at_backward_end);
    }
work:
    if (work_exit(cp, prev, guard) < 0)
        Py_CLEAR(r);
    Py_XDECREF(counted);
    Py_XDECREF(stem);
    Py_XDECREF(key);
    Py_XDECREF(record);
    Py_XDECREF(next);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

static PyObject *param_grad_call(ParamGradHook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 1)
        return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
    PyObject *s = PyObject_GetAttr(self->mstate, s_session), *path = NULL, *owner = NULL, *base = NULL,
             *modules = NULL, *got = NULL, *grad = NULL, *names = NULL, *grads = NULL, *fresh = NULL, *result = NULL;
    if (s == NULL)
        return NULL;
    if (s == Py_None) {
        result = Py_NewRef(Py_None);
        goto end;
    }
    if ((path = PyObject_GetAttr(s, s_call_path)) == NULL)
        goto end;
    if (Py_TYPE(path) != &CallPathType) {  /* the Python flow */
        result = PyObject_Vectorcall(self->slow, args, 1, NULL);
        goto end;
    }
    int on;
    if ((owner = PyObject_GetAttr(self->state, s_owner)) == NULL || (on = attr_true(owner, s_grads_active)) < 0
        || (on && ((base = PyObject_GetAttr(self->state, s_base)) == NULL
                   || (modules = PyObject_GetAttr(s, s_recorded_modules)) == NULL
                   || (on = PySequence_Contains(modules, base)) < 0)))
        goto end;
    if (!on) {
        result = Py_NewRef(Py_None);
        goto end;
    }
    if ((got = PyObject_GetAttr(self->state, s_got)) == NULL || (grad = PyObject_GetAttr(args[0], s_grad)) == NULL
        || PyObject_SetItem(got, self->name, grad) < 0 || (names = PyObject_GetAttr(self->state, s_names)) == NULL)
        goto end;
    Py_ssize_t want = PyObject_Length(names), have = PyObject_Length(got);
    if (want < 0 || have < 0)
        goto end;
    if (have != want) {
        result = Py_NewRef(Py_None);
        goto end;
    }
    /* in the order the module holds them (autograd's order differs with compiled backward) */
    if ((grads = PyDict_New()) == NULL)
        goto end;
    for (Py_ssize_t i = 0; i < want; i++) {
        PyObject *n = PySequence_GetItem(names, i), *g = n == NULL ? NULL : PyObject_GetItem(got, n);
        int err = g == NULL ? -1 : PyDict_SetItem(grads, n, g);
        Py_XDECREF(n);
        Py_XDECREF(g);
        if (err < 0)
            goto end;
    }
    if ((fresh = PyDict_New()) == NULL || PyObject_SetAttr(self->state, s_got, fresh) < 0)
        goto end;
    result = params_grad_emit((CallPath *)path, s, self->state, base, grads);
end:
    Py_DECREF(s);
    Py_XDECREF(path);
    Py_XDECREF(owner);
    Py_XDECREF(base);
    Py_XDECREF(modules);
    Py_XDECREF(got);
    Py_XDECREF(grad);
    Py_XDECREF(names);
    Py_XDECREF(grads);
    Py_XDECREF(fresh);
    return result;
}

static PyObject *param_grad_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    ParamGradHook *self = (ParamGradHook *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (!PyArg_ParseTuple(args, "OUOO:ParamGradHook", &self->state, &self->name, &self->mstate, &self->slow)) {
        self->state = self->name = self->mstate = self->slow = NULL;
        Py_DECREF(self);
        return NULL;
    }
    Py_INCREF(self->state);
    Py_INCREF(self->name);
    Py_INCREF(self->mstate);
    Py_INCREF(self->slow);
    self->vectorcall = (vectorcallfunc)param_grad_call;
    return (PyObject *)self;
}

static int param_grad_traverse(ParamGradHook *self, visitproc visit, void *arg) {
    Py_VISIT(self->state);
    Py_VISIT(self->mstate);
    Py_VISIT(self->slow);
    return 0;
}

static int param_grad_clear(ParamGradHook *self) {
    Py_CLEAR(self->state);
    Py_CLEAR(self->name);
    Py_CLEAR(self->mstate);
    Py_CLEAR(self->slow);
    return 0;
}

static void param_grad_dealloc(ParamGradHook *self) {
    PyObject_GC_UnTrack(self);
    param_grad_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject ParamGradHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe._call.ParamGradHook",
    .tp_basicsize = sizeof(ParamGradHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A parameter's post-accumulate-grad hook: the common case in C, every other the Python hook's.",
    .tp_new = param_grad_new,
    .tp_traverse = (traverseproc)param_grad_traverse,
    .tp_clear = (inquiry)param_grad_clear,
    .tp_dealloc = (destructor)param_grad_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ParamGradHook, vectorcall),
};

/* NodeHook(session_ref, key, parent, n_in, out_nr, slots, split=False): a OneNodeHook (capture/backward.py) fired
 * in C, for a call hooked on one node in a session with a CallPath (nothing is saved). torch calls it as the
 * node's post-hook with (grad_inputs, grad_outputs): the output's gradient (`out_nr`; with `split`, the one
 * its `read_output` took as the reshape's pre-hook), then each input's (`slots`: (slot in grad_inputs,
 * position among the call's inputs, how), `how` False or the steps of _input_chain, ((step, arg), ...),
 * whose backwards are done here as OneNodeHook does them: step 0 g.t(), 1 g.reshape(arg), 2 g.to(arg)),
 * recorded as tool work, and the record emitted through the session's emit_backward_record. Like OneNodeHook it
 * holds the session weakly (`session_ref`: the session's weak_self) and fires once, and only while the session's
 * backward_open is true. */
typedef struct {
    PyObject_HEAD
    PyObject *session, *key, *parent, *slots;  /* session: NULL once fired */
    PyObject *out_rec;  /* split: the output gradient's record read_output took (NULL: none yet) */
    Py_ssize_t n_in, out_nr;
    int split;
    vectorcallfunc vectorcall;
} NodeHook;

static PyObject *s_backward_open, *s_gradient_record, *s_emit_backward_record, *s_t, *s_reshape,
    *s_to;

/* `g` as the backwards of `how` (see NodeHook) hand it on: a new reference, or NULL */
static PyObject *undo_chain(PyObject *g, PyObject *how) {
    Py_INCREF(g);
    for (Py_ssize_t i = 0; g != NULL && i < PyTuple_GET_SIZE(how); i++) {
        PyObject *st = PyTuple_GET_ITEM(how, i), *next;
        long step = PyLong_AsLong(PyTuple_GET_ITEM(st, 0));
        if (step == 0) {
            next = PyObject_VectorcallMethod(s_t, &g, 1, NULL);
        } else {
            PyObject *a[2] = {g, PyTuple_GET_ITEM(st, 1)};
            next = PyObject_VectorcallMethod(step == 1 ? s_reshape : s_to, a, 2, NULL);
        }
        Py_DECREF(g);
        g = next;
    }
    return g;
}

/* a gradient's record as OneNodeHook makes it when nothing is saved: a plain tensor's from the summarizer
 * (its C path first), deferred; any other's from the session's gradient_record */
static PyObject *grad_record(CallPath *cp, PyObject *s, PyObject *g, PyObject *shared) {
    if (g == Py_None)
        Py_RETURN_NONE;
    if (Py_TYPE(g) == (PyTypeObject *)cp->tensor || Py_TYPE(g) == (PyTypeObject *)cp->parameter)
        return plain_record(cp, g, shared, Py_True);
    PyObject *a[5] = {s, g, Py_None, Py_False, s_empty};
    return PyObject_VectorcallMethod(s_gradient_record, a, 5, NULL);
}

/* session `s`'s CallPath (a new reference), its summarizer's share_forward in *shared (a new reference) and
 * tool work entered (*prev, *guard: for work_exit); NULL on an error, with nothing held */
static CallPath *hook_work(PyObject *s, PyObject **shared, PyObject **prev, PyObject **guard) {
    PyObject *cp_obj = PyObject_GetAttr(s, s_call_path);
    if (cp_obj == NULL)
        return NULL;
    if (!PyObject_TypeCheck(cp_obj, &CallPathType)) {
        PyErr_SetString(PyExc_TypeError, "NodeHook: the session has no CallPath");
        Py_DECREF(cp_obj);
        return NULL;
    }
    CallPath *cp = (CallPath *)cp_obj;
    if ((*shared = PyObject_GetAttr(cp->summarizer, s_share_forward)) == NULL) {
        Py_DECREF(cp_obj);
        return NULL;
    }
    if (work_enter(cp, prev, guard) < 0) {
        Py_CLEAR(*shared);
        Py_DECREF(cp_obj);
        return NULL;
    }
    return cp;
}

/* grad_outputs[out_nr], None past its end (borrowed) */
static PyObject *output_grad(NodeHook *self, PyObject *grad_outputs) {
    return self->out_nr < PyTuple_GET_SIZE(grad_outputs) ? PyTuple_GET_ITEM(grad_outputs, self->out_nr) : Py_None;
}

static PyObject *node_hook_fire(NodeHook *self, PyObject *s, PyObject *grad_inputs, PyObject *grad_outputs) {
    PyObject *shared = NULL, *prev = NULL, *guard = NULL, *outs = NULL, *ins = NULL, *r = NULL, *g, *out_rec;
    int failed = 1;
    CallPath *cp = hook_work(s, &shared, &prev, &guard);
    if (cp == NULL)
        return NULL;
    if (self->split) {  /* read by the reshape's pre-hook (none if it never ran) */
        out_rec = self->out_rec != NULL ? self->out_rec : Py_None;
        Py_INCREF(out_rec);
        Py_CLEAR(self->out_rec);
    } else {
        out_rec = grad_record(cp, s, output_grad(self, grad_outputs), shared);
    }
    if (out_rec == NULL || (outs = PyList_New(1)) == NULL) {
        Py_XDECREF(out_rec);
        goto work;
    }
    PyList_SET_ITEM(outs, 0, out_rec);
    if ((ins = PyList_New(self->n_in)) == NULL)
        goto work;
    for (Py_ssize_t i = 0; i < self->n_in; i++) {
        Py_INCREF(Py_None);
        PyList_SET_ITEM(ins, i, Py_None);
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->slots); i++) {
        PyObject *sp = PyTuple_GET_ITEM(self->slots, i), *how = PyTuple_GET_ITEM(sp, 2);
        Py_ssize_t slot = PyLong_AsSsize_t(PyTuple_GET_ITEM(sp, 0)), pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(sp, 1));
        if (PyErr_Occurred())
            goto work;
        if (slot < 0 || slot >= PyTuple_GET_SIZE(grad_inputs) || pos < 0 || pos >= self->n_in)
            continue;
        g = PyTuple_GET_ITEM(grad_inputs, slot);
        if (g == Py_None)
            continue;
        PyObject *rec;
        if (how == Py_False) {
            rec = grad_record(cp, s, g, shared);
        } else {
            PyObject *undone = undo_chain(g, how);
            rec = undone == NULL ? NULL : grad_record(cp, s, undone, shared);
            Py_XDECREF(undone);
        }
        if (rec == NULL)
            goto work;
        PyList_SetItem(ins, pos, rec);  /* (steals rec, drops the None) */
    }
    {
        PyObject *a[6] = {s, self->key, outs, ins, s_empty, self->parent};
        r = PyObject_VectorcallMethod(s_emit_backward_record, a, 6, NULL);
    }
    failed = r == NULL;
work:
    if (work_exit(cp, prev, guard) < 0)
        failed = 1;
    Py_XDECREF(r);
    Py_XDECREF(outs);
    Py_XDECREF(ins);
    Py_DECREF(shared);
    Py_DECREF(cp);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

/* the session while the hook may still record (not fired, session alive, backward_open): a new reference;
 * NULL with no error when it may not, NULL with an error on one */
static PyObject *live_session(NodeHook *self) {
    if (self->session == NULL)
        return NULL;
    PyObject *s = PyWeakref_GetObject(self->session);  /* (borrowed) */
    if (s == NULL || s == Py_None)
        return NULL;
    Py_INCREF(s);
    int open = attr_true(s, s_backward_open);
    if (open <= 0) {
        Py_DECREF(s);
        return NULL;
    }
    return s;
}

static PyObject *node_hook_call(NodeHook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 2 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "NodeHook(grad_inputs, grad_outputs): two tuples");
        return NULL;
    }
    PyObject *s = live_session(self);
    if (s == NULL)
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    Py_CLEAR(self->session);  /* once: a retained graph's second backward is not this step's call */
    PyObject *got = node_hook_fire(self, s, args[0], args[1]);
    Py_DECREF(s);
    return got;
}

/* read_output(grad_outputs): the pre-hook of the reshape that made the call's output (`split`) */
static PyObject *node_hook_read_output(NodeHook *self, PyObject *grad_outputs) {
    if (!PyTuple_Check(grad_outputs)) {
        PyErr_SetString(PyExc_TypeError, "NodeHook.read_output(grad_outputs): a tuple");
        return NULL;
    }
    PyObject *s = live_session(self), *shared, *prev, *guard;
    if (s == NULL)
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    CallPath *cp = hook_work(s, &shared, &prev, &guard);
    PyObject *rec = cp == NULL ? NULL : grad_record(cp, s, output_grad(self, grad_outputs), shared);
    int failed = cp == NULL || work_exit(cp, prev, guard) < 0 || rec == NULL;
    if (!failed)
        Py_XSETREF(self->out_rec, Py_NewRef(rec));
    Py_XDECREF(rec);
    if (cp != NULL) {
        Py_DECREF(shared);
        Py_DECREF((PyObject *)cp);
    }
    Py_DECREF(s);
    return failed ? NULL : Py_NewRef(Py_None);
}

static PyMemberDef node_hook_members[] = {
    {"key", T_OBJECT, offsetof(NodeHook, key), READONLY, "the backward record's key"},
    {"slots", T_OBJECT, offsetof(NodeHook, slots), READONLY, "(slot, input position, how) of each input"},
    {"split", T_INT, offsetof(NodeHook, split), READONLY, "whether the output's gradient is read at a reshape"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef node_hook_methods[] = {
    {"read_output", (PyCFunction)node_hook_read_output, METH_O,
     "The pre-hook of the reshape that made the call's output (split): its gradient's record."},
    {NULL, NULL, 0, NULL},
};

static PyObject *node_hook_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *session, *key, *parent, *slots;
    Py_ssize_t n_in, out_nr;
    int split = 0;
    (void)kwargs;
    if (!PyArg_ParseTuple(args, "O!UOnnO!|p:NodeHook", &_PyWeakref_RefType, &session, &key, &parent, &n_in, &out_nr,
                          &PyTuple_Type, &slots, &split))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(slots); i++) {
        PyObject *sp = PyTuple_GET_ITEM(slots, i), *how;
        int ok = PyTuple_Check(sp) && PyTuple_GET_SIZE(sp) == 3 && PyLong_Check(PyTuple_GET_ITEM(sp, 0))
                 && PyLong_Check(PyTuple_GET_ITEM(sp, 1));
        if (ok && (how = PyTuple_GET_ITEM(sp, 2)) != Py_False) {
            ok = PyTuple_Check(how);
            for (Py_ssize_t j = 0; ok && j < PyTuple_GET_SIZE(how); j++) {
                PyObject *st = PyTuple_GET_ITEM(how, j);
                ok = PyTuple_Check(st) && PyTuple_GET_SIZE(st) == 2 && PyLong_Check(PyTuple_GET_ITEM(st, 0));
                long step = ok ? PyLong_AsLong(PyTuple_GET_ITEM(st, 0)) : -1;
                ok = ok && step >= 0 && step <= 2;
            }
        }
        if (!ok) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "NodeHook: slots are (slot, position, how) with ints, and how False or "
                                             "((step 0-2, arg), ...)");
            return NULL;
        }
    }
    (void)type;
    return node_hook_make(session, key, parent, n_in, out_nr, slots, split);
}

/* made_hooks' list: every NodeHook made is appended to it while set (NULL: none) */
static PyObject *made_hooks_list;

static PyObject *made_hooks(PyObject *module, PyObject *list) {
    (void)module;
    if (list != Py_None && !PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "made_hooks(list or None)");
        return NULL;
    }
    Py_XSETREF(made_hooks_list, list == Py_None ? NULL : Py_NewRef(list));
    Py_RETURN_NONE;
}

/* a NodeHook of checked fields (fast_backward_end's are made so) */
static PyObject *node_hook_make(PyObject *session, PyObject *key, PyObject *parent, Py_ssize_t n_in, Py_ssize_t out_nr,
                                PyObject *slots, int split) {
    NodeHook *self = (NodeHook *)NodeHookType.tp_alloc(&NodeHookType, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(session);
    Py_INCREF(key);
    Py_INCREF(parent);
    Py_INCREF(slots);
    self->session = session;
    self->key = key;
    self->parent = parent;
    self->slots = slots;
    self->n_in = n_in;
    self->out_nr = out_nr;
    self->split = split;
    self->vectorcall = (vectorcallfunc)node_hook_call;
    if (made_hooks_list != NULL && PyList_Append(made_hooks_list, (PyObject *)self) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int node_hook_traverse(NodeHook *self, visitproc visit, void *arg) {
    Py_VISIT(self->session);
    Py_VISIT(self->key);
    Py_VISIT(self->parent);
    Py_VISIT(self->slots);
    Py_VISIT(self->out_rec);
    return 0;
}

static int node_hook_clear(NodeHook *self) {
    Py_CLEAR(self->session);
    Py_CLEAR(self->key);
    Py_CLEAR(self->parent);
    Py_CLEAR(self->slots);
    Py_CLEAR(self->out_rec);
    return 0;
}

static void node_hook_dealloc(NodeHook *self) {
    PyObject_GC_UnTrack(self);
    node_hook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject NodeHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe._call.NodeHook",
    .tp_basicsize = sizeof(NodeHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A OneNodeHook fired in C: a call's backward record from its node's post-hook.",
    .tp_new = node_hook_new,
    .tp_methods = node_hook_methods,
    .tp_members = node_hook_members,
    .tp_traverse = (traverseproc)node_hook_traverse,
    .tp_clear = (inquiry)node_hook_clear,
    .tp_dealloc = (destructor)node_hook_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(NodeHook, vectorcall),
};

/* PassOn(mode, table, state, handler, on_dynamo): the API mode's __torch_function__ as torch calls it,
 * bound to the mode (`__self__`: torch takes a mode's handler only when it is bound to the mode). A call
 * the mode does not record (its function is not in `table`) runs at once, as the Python handler runs it,
 * when no session is open, msprobe itself made it (`state.busy`) or nothing waits for a batch launch
 * (the session's summarizer is not deferred); every other call goes to `handler`, the mode's Python
 * method. Most calls a training step makes under the mode are such reads (`p.grad` in an optimizer,
 * `x.shape`): here they cost no Python frame. `on_dynamo` (or None): called, once, at the first call that
 * finds torch._dynamo imported (Dynamo traces the Python handler: this one must step aside first).
 * With `graph_task` (torch._C._current_graph_task_id) and `operators` ((opcode << 8 | argument) -> (dunder,
 * in place?), operator_names.operator_table), a call the mode records goes from here to the session's C call
 * path (`fast_call`) too, as the Python handler would hand it, wherever nothing that handler asks about
 * applies: a session with a C call path below L2, not msprobe's own or a nested call, no process group up
 * (the caller's module decides), not in a backward pass (a checkpoint's recomputation), a function that
 * writes no argument behind its version (api_table.argument_writers). While this handler is in front,
 * Dynamo has compiled nothing and traces nothing, so the handler's compiler questions have their answer. */
typedef struct {
    PyObject_HEAD
    PyObject *mode, *table, *state, *handler, *on_dynamo, *graph_task, *operators;
    vectorcallfunc vectorcall;
} PassOn;

static PyObject *s_summarizer, *s_dynamo, *s_distributed, *s_api_level_l2, *s_fast_call,
    *s_out, *s_inplace;

/* 1 when the Python handler must see an unrecorded call (a session whose summaries wait for a launch may
 * need one before it), 0 when it runs at once, -1 on error */
static int needs_handler(PassOn *self) {
    PyObject *session = PyObject_GetAttr(self->state, s_session), *flag = NULL, *summarizer = NULL;
    int wants = -1;
    if (session == NULL)
        return -1;
    if (session == Py_None) {
        wants = 0;
        goto done;
    }
    if ((flag = PyObject_GetAttr(self->state, s_busy)) == NULL || (wants = PyObject_IsTrue(flag)) != 0) {
        wants = wants > 0 ? 0 : -1;  /* msprobe's own call: at once */
        goto done;
    }
    Py_SETREF(flag, NULL);
    if ((summarizer = PyObject_GetAttr(session, s_summarizer)) == NULL
        || (flag = PyObject_GetAttr(summarizer, s_deferred)) == NULL)
        goto done;
    wants = PyObject_IsTrue(flag);
done:
    Py_DECREF(session);
    Py_XDECREF(flag);
    Py_XDECREF(summarizer);
    return wants;
}

/* The dunder the caller is executing where `info` says an operator may have made the call (operator_names.py:
 * `x + y` reaches the mode as Tensor.add): sets *name and *inplace when it is one. 0, or -1 on error. */
static int operator_of(PassOn *self, PyObject **name, int *inplace) {
    PyFrameObject *frame = PyEval_GetFrame();
    if (frame == NULL)
        return 0;
    PyCodeObject *code = PyFrame_GetCode(frame);
    int lasti = PyFrame_GetLasti(frame);
    PyObject *bytes = PyCode_GetCode(code);
    Py_DECREF(code);
    if (bytes == NULL)
        return -1;
    int err = 0;
    if (lasti >= 0 && lasti + 1 < PyBytes_GET_SIZE(bytes)) {
        const unsigned char *co = (const unsigned char *)PyBytes_AS_STRING(bytes);
        PyObject *at = PyLong_FromLong((long)co[lasti] << 8 | co[lasti + 1]);
        PyObject *hit = at == NULL ? NULL : PyDict_GetItemWithError(self->operators, at);
        Py_XDECREF(at);
        if (hit != NULL && PyTuple_Check(hit) && PyTuple_GET_SIZE(hit) == 2) {
            *name = PyTuple_GET_ITEM(hit, 0);
            *inplace = PyTuple_GET_ITEM(hit, 1) == Py_True;
        } else if (PyErr_Occurred()) {
            err = -1;
        }
    }
    Py_DECREF(bytes);
    return err;
}

/* A recorded call straight to the session's C call path (see PassOn): the result, or NULL with *handled 0
 * where the Python handler decides (or NULL and an error). */
static PyObject *record_here(PassOn *self, PyObject *info, PyObject *func, PyObject *args, PyObject *kwargs,
                             int *handled) {
    PyObject *session = NULL, *fast = NULL, *out = NULL, *task = NULL;
    *handled = 0;
    if (!PyTuple_Check(info) || PyTuple_GET_SIZE(info) != 6 || PyTuple_GET_ITEM(info, 5) != Py_None)
        return NULL;  /* (a function that writes an argument behind its version: the handler's) */
    if ((session = PyObject_GetAttr(self->state, s_session)) == NULL)
        goto fail;
    if (session == Py_None)
        goto done;
    int t;
    if ((t = attr_true(self->state, s_busy)) != 0 || (t = attr_true(self->state, s_depth)) != 0
        || (t = attr_true(self->mode, s_distributed)) != 0 || (t = attr_true(session, s_api_level_l2)) != 0) {
        if (t < 0)
            goto fail;
        goto done;
    }
    if ((task = PyObject_CallNoArgs(self->graph_task)) == NULL)
        goto fail;
    long id = PyLong_AsLong(task);
    if (id == -1 && PyErr_Occurred())
        goto fail;
    if (id != -1)  /* in a backward pass: maybe a checkpoint's recomputation (recompute.py) */
        goto done;
    if ((fast = PyObject_GetAttr(session, s_fast_call)) == NULL)
        goto fail;
    if (fast == Py_None)
        goto done;
    PyObject *name = PyTuple_GET_ITEM(info, 1), *flag = PyTuple_GET_ITEM(info, 4);
    int inplace = PyObject_IsTrue(PyTuple_GET_ITEM(info, 2));
    if (inplace < 0)
        goto fail;
    if (PyTuple_GET_ITEM(info, 3) == Py_True && operator_of(self, &name, &inplace) < 0)
        goto fail;
    PyObject *kw = kwargs;
    if (kw == NULL && (kw = PyDict_New()) == NULL)
        goto fail;
    int out_arg = PyDict_Contains(kw, s_out), mutates = out_arg;
    if (out_arg < 0)
        goto fail_kw;
    if (!mutates && flag != Py_None) {
        Py_ssize_t at = PyLong_AsSsize_t(flag);
        if (at == -1 && PyErr_Occurred())
            goto fail_kw;
        PyObject *given = PyDict_GetItemWithError(kw, s_inplace);
        if (given == NULL && PyErr_Occurred())
            goto fail_kw;
        mutates = given == Py_True || (PyTuple_GET_SIZE(args) > at && PyTuple_GET_ITEM(args, at) == Py_True);
    }
    PyObject *call[8] = {session, PyTuple_GET_ITEM(info, 0), name, func, args, kw,
                         inplace || out_arg ? Py_True : Py_False, mutates ? Py_True : Py_False};
    *handled = 1;
    out = PyObject_Vectorcall(fast, call, 8, NULL);
fail_kw:
    if (out == NULL)
        *handled = 1;  /* (an error: raised from here) */
    if (kw != kwargs)
        Py_DECREF(kw);
    goto done;
fail:
    *handled = 1;
done:
    Py_XDECREF(session);
    Py_XDECREF(fast);
    Py_XDECREF(task);
    return out;
}

static PyObject *pass_on_call(PassOn *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->on_dynamo != NULL) {
        PyObject *dynamo = PyDict_GetItemWithError(PyImport_GetModuleDict(), s_dynamo);
        if (dynamo == NULL && PyErr_Occurred())
            return NULL;
        if (dynamo != NULL) {  /* (the caller holds this object through the call: it may leave the mode) */
            PyObject *on_dynamo = self->on_dynamo, *got;
            self->on_dynamo = NULL;
            got = PyObject_CallNoArgs(on_dynamo);
            Py_DECREF(on_dynamo);
            if (got == NULL)
                return NULL;
            Py_DECREF(got);
            return PyObject_Vectorcall(self->handler, args, nargsf, kwnames);
        }
    }
    /* (func, types, args=(), kwargs=None), positional, as torch hands them */
    if (kwnames == NULL && nargs >= 2 && nargs <= 4 && (nargs < 3 || PyTuple_CheckExact(args[2]))
        && (nargs < 4 || args[3] == Py_None || PyDict_CheckExact(args[3]))) {
        PyObject *info = PyDict_GetItemWithError(self->table, args[0]);
        if (info != NULL && self->graph_task != NULL && nargs >= 3) {
            PyObject *kwargs = nargs == 4 && args[3] != Py_None ? args[3] : NULL;
            int handled;
            PyObject *got = record_here(self, info, args[0], args[2], kwargs, &handled);
            if (handled)
                return got;
        }
        if (info == NULL) {
            if (PyErr_Occurred())
                return NULL;
            int wants = needs_handler(self);
            if (wants < 0)
                return NULL;
            if (!wants) {
                PyObject *kwargs = nargs == 4 && args[3] != Py_None && PyDict_GET_SIZE(args[3]) ? args[3] : NULL;
                if (nargs >= 3)
                    return PyObject_Call(args[0], args[2], kwargs);
                PyObject *none = PyTuple_New(0), *got = none == NULL ? NULL : PyObject_Call(args[0], none, kwargs);
                Py_XDECREF(none);
                return got;
            }
        }
    }
    return PyObject_Vectorcall(self->handler, args, nargsf, kwnames);
}

static PyObject *pass_on_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PassOn *self = (PassOn *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->graph_task = self->operators = NULL;
    if (!PyArg_ParseTuple(args, "OO!OOO|OO!:PassOn", &self->mode, &PyDict_Type, &self->table, &self->state,
                          &self->handler, &self->on_dynamo, &self->graph_task, &PyDict_Type, &self->operators)) {
        self->mode = self->table = self->state = self->handler = self->on_dynamo = NULL;
        self->graph_task = self->operators = NULL;
        Py_DECREF(self);
        return NULL;
    }
    if (self->graph_task == Py_None || self->operators == NULL)
        self->graph_task = self->operators = NULL;
    Py_XINCREF(self->graph_task);
    Py_XINCREF(self->operators);
    Py_INCREF(self->mode);
    Py_INCREF(self->table);
    Py_INCREF(self->state);
    Py_INCREF(self->handler);
    if (self->on_dynamo == Py_None)
        self->on_dynamo = NULL;
    else
        Py_INCREF(self->on_dynamo);
    self->vectorcall = (vectorcallfunc)pass_on_call;
    return (PyObject *)self;
}

/* garbage-collected: the mode holds it in its __dict__, it holds the mode */
static int pass_on_traverse(PassOn *self, visitproc visit, void *arg) {
    Py_VISIT(self->mode);
    Py_VISIT(self->table);
    Py_VISIT(self->state);
    Py_VISIT(self->handler);
    Py_VISIT(self->on_dynamo);
    Py_VISIT(self->graph_task);
    Py_VISIT(self->operators);
    return 0;
}

static int pass_on_clear(PassOn *self) {
    Py_CLEAR(self->mode);
    Py_CLEAR(self->table);
    Py_CLEAR(self->state);
    Py_CLEAR(self->handler);
    Py_CLEAR(self->on_dynamo);
    Py_CLEAR(self->graph_task);
    Py_CLEAR(self->operators);
    return 0;
}

static void pass_on_dealloc(PassOn *self) {
    PyObject_GC_UnTrack(self);
    pass_on_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef pass_on_members[] = {
    {"__self__", T_OBJECT, offsetof(PassOn, mode), READONLY, "the mode it handles calls for"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PassOnType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe._call.PassOn",
    .tp_basicsize = sizeof(PassOn),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "The API mode's __torch_function__: unrecorded calls at once, the others to the Python handler.",
    .tp_new = pass_on_new,
    .tp_traverse = (traverseproc)pass_on_traverse,
    .tp_clear = (inquiry)pass_on_clear,
    .tp_dealloc = (destructor)pass_on_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(PassOn, vectorcall),
    .tp_members = pass_on_members,
};

/* walk(roots, leaf, nonleaf, floor, max_nodes, node_types) -> (edges, cast_to): edges.c's walk_edges */
static PyObject *walk(PyObject *module, PyObject *args) {
    PyObject *roots, *leaf, *nonleaf;
    long long floor;
    Py_ssize_t max_nodes;
    NodeTypes nt = {NULL, NULL, NULL, NULL, NULL, NULL};
    (void)module;
    if (!PyArg_ParseTuple(args, "OO!O!Ln(O!O!O!O!):walk", &roots, &PyDict_Type, &leaf, &PyDict_Type, &nonleaf, &floor,
                          &max_nodes, &PyType_Type, &nt.acc_grad, &PyType_Type, &nt.transpose, &PyType_Type,
                          &nt.to_copy, &PyTuple_Type, &nt.reshapes))
        return NULL;
    return walk_edges(&nt, roots, leaf, nonleaf, floor, max_nodes);
}

static PyMethodDef module_functions[] = {
    {"walk", walk, METH_VARARGS,
     "walk(roots, leaf, nonleaf, floor, max_nodes, node_types) -> (edges, cast_to), as backward._attach_walk "
     "walks the nodes a call made."},
    {"made_hooks", made_hooks, METH_O,
     "made_hooks(list or None): while a list is set, every NodeHook made is appended to it (for tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_call", NULL, -1, module_functions};

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__call(void) {
    INTERN(s_busy, "busy");
    INTERN(s_depth, "depth");
    INTERN(s_hit, "hit");
    INTERN(s_in_optimizer, "in_optimizer");
    INTERN(s_share_forward, "share_forward");
    INTERN(s_defer_forward, "defer_forward");
    INTERN(s_value_record, "value_record");
    INTERN(s_outputs_record, "outputs_record");
    INTERN(s_emit, "emit");
    INTERN(s_before_mutation, "before_mutation");
    INTERN(s_result_of, "result_of");
    INTERN(s_backward_begin, "backward_begin");
    INTERN(s_backward_end, "backward_end");
    INTERN(s_enter, "__enter__");
    INTERN(s_exit, "__exit__");
    INTERN(s_input_args, "input_args");
    INTERN(s_input_kwargs, "input_kwargs");
    INTERN(s_output, "output");
    INTERN(s_optimizer, "optimizer");
    INTERN(s_param_record, "param_record");
    INTERN(s_parameters, "parameters");
    INTERN(s_recorded_modules, "recorded_modules");
    INTERN(s_session, "session");
    INTERN(s_summarizer, "summarizer");
    INTERN(s_deferred, "deferred");
    INTERN(s_dynamo, "torch._dynamo");
    INTERN(s_distributed, "_distributed");
    INTERN(s_api_level_l2, "api_level_l2");
    INTERN(s_fast_call, "fast_call");
    INTERN(s_out, "out");
    INTERN(s_inplace, "inplace");
    INTERN(s_backward_open, "backward_open");
    INTERN(s_call_path, "call_path");
    INTERN(s_gradient_record, "gradient_record");
    INTERN(s_emit_backward_record, "emit_backward_record");
    INTERN(s_t, "t");
    INTERN(s_reshape, "reshape");
    INTERN(s_to, "to");
    INTERN(s_fold_transposes, "fold_transposes");
    INTERN(s_weak_self, "weak_self");
    INTERN(s_register_hook, "register_hook");
    INTERN(s_register_prehook, "register_prehook");
    INTERN(s_read_output, "read_output");
    INTERN(s_requires_grad, "requires_grad");
    INTERN(s_output_nr, "output_nr");
    INTERN(s_forward_active, "forward_active");
    INTERN(s_passes_everything, "passes_everything");
    INTERN(s_parameters_attr, "_parameters");
    INTERN(s_module_stack_attr, "module_stack");
    INTERN(s_dot_forward, ".forward.");
    INTERN(s_owner, "owner");
    INTERN(s_grads_active, "grads_active");
    INTERN(s_got, "got");
    INTERN(s_names, "names");
    INTERN(s_base, "base");
    INTERN(s_counted, "counted");
    INTERN(s_stem, "stem");
    INTERN(s_grad, "grad");
    INTERN(s_launch_queued, "_launch_queued");
    INTERN(s_launch_at_backward_end, "_launch_at_backward_end");
    INTERN(s_emit_params_grad, "emit_params_grad");
    INTERN(s_dot_backward, ".backward.");
    INTERN(s_type, "type");
    INTERN(s_value, "value");
    INTERN(s_nan, "nan");
    INTERN(s_inf, "inf");
    INTERN(s_minus_inf, "-inf");
    INTERN(s_float, "float");
    INTERN(s_bool, "bool");
    INTERN(s_int, "int");
    INTERN(s_str, "str");
    INTERN(s_slice, "slice");
    INTERN(s_ellipsis, "ellipsis");
    INTERN(s_dots, "...");
    if (edges_init() < 0)
        return NULL;
    if ((s_empty = PyTuple_New(0)) == NULL || (api_names = PyDict_New()) == NULL)
        return NULL;
    if (PyType_Ready(&CallPathType) < 0 || PyType_Ready(&PassOnType) < 0 || PyType_Ready(&FrameType) < 0
        || PyType_Ready(&NodeHookType) < 0 || PyType_Ready(&ModuleHookType) < 0
        || PyType_Ready(&ParamGradHookType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&CallPathType);
    if (PyModule_AddObject(m, "CallPath", (PyObject *)&CallPathType) < 0) {
        Py_DECREF(&CallPathType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&PassOnType);
    if (PyModule_AddObject(m, "PassOn", (PyObject *)&PassOnType) < 0) {
        Py_DECREF(&PassOnType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&NodeHookType);
    if (PyModule_AddObject(m, "NodeHook", (PyObject *)&NodeHookType) < 0) {
        Py_DECREF(&NodeHookType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&ModuleHookType);
    if (PyModule_AddObject(m, "ModuleHook", (PyObject *)&ModuleHookType) < 0) {
        Py_DECREF(&ModuleHookType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&ParamGradHookType);
    if (PyModule_AddObject(m, "ParamGradHook", (PyObject *)&ParamGradHookType) < 0) {
        Py_DECREF(&ParamGradHookType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
