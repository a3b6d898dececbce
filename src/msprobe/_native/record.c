/* msprobe._record: the common cases of Summarizer.record (pytorch/summary/summarizer.py) in C, where each
 * is a dozen attribute reads that cost more in the interpreter than in the reads themselves.
 *
 * Recorder(objects, cache, names, kinds, tensor, parameter, strided, entry_type, limit, small, threads, stats, md5,
 *          device=None, blank=None, per_buffer=0, unkeyed=0)
 * .record(owner, t, shared, defer=False, keyed=False) -> t's record, or None: "take the Python path" (then
 * nothing was changed); `defer`: a device summary may wait for the owner's next launch; `keyed`: the caller
 * wants its cache entry (Summarizer.record).
 *   1. `t` is the tensor object summarised before (`objects`, the summarizer's per-object table) at the
 *      same version, memory and shape: its record, as the Python path gives it; fields still in device
 *      slots are registered on a record of its own as slots.fill_from_slot does (fill_one).
 *   2. a plain (`tensor` or `parameter`, not a subclass) strided CPU tensor of 2 or more elements, not
 *      an inference tensor, contiguous or a view the kernel reads as host.statistics does (a transpose:
 *      one dense run; a chunk of a wider tensor: rows): its memory-keyed cache entry (`cache`, keyed by
 *      layout.element_span; with `md5` a view by its layout, cache.exact_key) when alive at the same
 *      version, else its statistics from the kernel of msprobe._moments (called through its capsule,
 *      `kinds`: dtype -> kernel kind; on `threads()` threads from `small` elements, else on one) and, with
 *      `md5`, the CRC-32 of its elements in index order from msprobe._crc (its capsule, on as many
 *      threads), as host.crc32_of gives it;
 *      the same cache entry (`entry_type`, CacheEntry) and object-table entry as the Python path makes;
 *      but a contiguous one of fewer than `unkeyed` elements (cache.UNKEYED_MAX), unless `keyed`, is read
 *      again at every record, with no key, entry or row (owner.entry None), as the Python path reads it.
 *   3. such a tensor of 2 or more elements elsewhere, in any layout (and on the CPU too when `small` is 0:
 *      the device path): its cache entry when alive at the same version (fields still in slots registered
 *      with fill_one), else its summaries into device slots: contiguous and deferred on a lane that has
 *      deferred its dtype before, queued here (defer_dense: statistics, with md5 the checksum too); contiguous,
 *      statistics only and taken now on torch's kernels, copied into its waiting staging buffer here
 *      (stage_dense); both on `device`, the owner's DeviceSummaries (`blank` is a record's value fields,
 *      `per_buffer` slots.SLOTS_PER_BUFFER); any other through
 *      `owner._slots_of(t, n, span, storage address, defer)` -> (values, slots); the cache and
 *      object-table entries as the Python path makes them.
 * fill_stats(fields, ns, dtypes, codes, address) and fill_waiting(fields, fills): readback.py's turning of
 * resolved statistics rows into record fields, and of the records waiting for them (see each function).
 * Everything else (other dtypes, a NaN or inf, other views on the CPU, views that msprobe._crc does not
 * read or that are not contiguous on the device path with md5) is None.
 * Tensor attributes are read through the C-API by interned names: no torch headers, a plain C compiler.
 * The table entries are the Python path's own: (weakref to t, data_ptr, shape, record, entry)
 * and CacheEntry(weakref to the storage, version, values, slots); records are dicts in msProbe's
 * field order (type, dtype, shape, the value fields, requires_grad). The device path's objects are
 * summary/slots.py's Buffer (used, ns, dtypes, nbytes, fields, values, fills), device.py's _Lane (fast,
 * fast_md5, open, kernels, stage_max, stages), _Stage (used, views, slots) and DeviceSummaries (_lanes,
 * pending, _memory, launch) and core's Deferral (queue, held, max_items, max_bytes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>

#include "crc.h"
#include "moments.h"

static moments_kernel kernel;
static crc_strided crc_read;

static PyObject *s_slots_of, *s_version, *s_data_ptr, *s_shape, *s_dtype, *s_layout, *s_is_cpu,
    *s_is_contiguous, *s_device, *s_untyped_storage, *s_requires_grad, *s_slots, *s_ref, *s_entry_version, *s_entry, *s_values,
    *s_type, *s_torch_tensor, *s_stride, *s_max, *s_min, *s_mean, *s_norm, *s_md5, *s_is_neg, *s_element_size,
    *s_lanes, *s_kernels, *s_stage_max, *s_stages, *s_views, *s_copy_, *s_fast, *s_fast_md5, *s_nbytes, *s_open,
    *s_used, *s_ns, *s_dtypes, *s_fields, *s_fills, *s_pending, *s_memory, *s_held, *s_launch, *s_detach;
static PyObject *minus_one;  /* an invalidated CacheEntry's version: no tensor's */

typedef struct {
    PyObject_HEAD
    PyObject *objects, *cache, *names, *kinds, *tensor, *parameter, *strided, *entry_type, *threads;
    /* the device path's common case (see defer_dense): the owner's DeviceSummaries, its Deferral and that
     * Deferral's queue, a record's blank value fields; NULL: always through `_slots_of` */
    PyObject *device, *deferral, *queue, *blank;
    Py_ssize_t limit, small, per_buffer, max_items, max_bytes, unkeyed;
    int stats, md5;
} Recorder;

/* t.name() */
static PyObject *call0(PyObject *t, PyObject *name) {
    return PyObject_VectorcallMethod(name, &t, 1, NULL);  /* (no ARGUMENTS_OFFSET: args[-1] is not ours) */
}

/* {"type", "dtype", "shape", **values, "requires_grad"}: a record, as _record builds it (not presized:
 * CPython's presized dict has general keys, slower to copy and encode than an all-string dict's) */
static PyObject *new_record(PyObject *name, PyObject *shape, PyObject *values, PyObject *requires_grad) {
    PyObject *rec = PyDict_New();
    PyObject *dims, *k, *v;
    if (PyTuple_Check(shape)) {  /* torch.Size: its items into a list of that size, no iterator */
        Py_ssize_t nd = PyTuple_GET_SIZE(shape);
        if ((dims = PyList_New(nd)) != NULL)
            for (Py_ssize_t i = 0; i < nd; i++)
                PyList_SET_ITEM(dims, i, Py_NewRef(PyTuple_GET_ITEM(shape, i)));
    } else {
        dims = PySequence_List(shape);
    }
    Py_ssize_t pos = 0;
    if (rec == NULL || dims == NULL || PyDict_SetItem(rec, s_type, s_torch_tensor) < 0
        || PyDict_SetItem(rec, s_dtype, name) < 0 || PyDict_SetItem(rec, s_shape, dims) < 0)
        goto fail;
    while (PyDict_Next(values, &pos, &k, &v))
        if (PyDict_SetItem(rec, k, v) < 0)
            goto fail;
    if (PyDict_SetItem(rec, s_requires_grad, requires_grad) < 0)
        goto fail;
    Py_DECREF(dims);
    return rec;
fail:
    Py_XDECREF(rec);
    Py_XDECREF(dims);
    return NULL;
}

/* objects[id(t)] = (weakref(t), data_ptr, shape, rec, entry); the table starts over past `limit` */
static int remember(Recorder *self, PyObject *tid, PyObject *t, PyObject *ptr, PyObject *shape, PyObject *rec,
                    PyObject *entry) {
    if (PyDict_GET_SIZE(self->objects) > self->limit)
        PyDict_Clear(self->objects);
    PyObject *ref = PyWeakref_NewRef(t, NULL);
    if (ref == NULL)
        return -1;
    PyObject *row = PyTuple_Pack(5, ref, ptr, shape, rec, entry);
    Py_DECREF(ref);
    if (row == NULL)
        return -1;
    int err = PyDict_SetItem(self->objects, tid, row);
    Py_DECREF(row);
    return err;
}

/* 1 when entry.slots is an empty list (no field still on a device), 0 when not, -1 on error */
static int no_slots(PyObject *entry) {
    PyObject *slots = PyObject_GetAttr(entry, s_slots);
    if (slots == NULL)
        return -1;
    int empty = PyList_CheckExact(slots) && PyList_GET_SIZE(slots) == 0;
    Py_DECREF(slots);
    return empty;
}

/* slots.fill_from_slot(rec, slot), inline: `rec` gets the slot's row of values now, or when its buffer is
 * resolved (appended to the buffer's `fills` before `values` is looked at again: a resolve on the lane
 * thread sets `values` before it fills the records waiting) */
static int fill_one(PyObject *rec, PyObject *slot) {
    if (!PyTuple_CheckExact(slot) || PyTuple_GET_SIZE(slot) != 2) {
        PyErr_SetString(PyExc_TypeError, "a slot: (buffer, row)");
        return -1;
    }
    PyObject *buf = PyTuple_GET_ITEM(slot, 0), *row = PyTuple_GET_ITEM(slot, 1), *fills = NULL, *pair = NULL;
    PyObject *values = PyObject_GetAttr(buf, s_values);
    int err = -1;
    if (values == NULL)
        return -1;
    if (values == Py_None) {
        if ((fills = PyObject_GetAttr(buf, s_fills)) == NULL || (pair = PyTuple_Pack(2, row, rec)) == NULL
            || PyList_Append(fills, pair) < 0)
            goto done;
        Py_SETREF(values, PyObject_GetAttr(buf, s_values));
        if (values == NULL)
            goto done;
    }
    if (values != Py_None) {
        PyObject *got = PyObject_GetItem(values, row);
        if (got == NULL || PyDict_Update(rec, got) < 0) {
            Py_XDECREF(got);
            goto done;
        }
        Py_DECREF(got);
    }
    err = 0;
done:
    Py_XDECREF(values);
    Py_XDECREF(fills);
    Py_XDECREF(pair);
    return err;
}

/* fill_one(rec, slot) for each slot of `entry` (a record of its own gets the fields still on a device);
 * 0, or -1 on error */
static int fill_slots(PyObject *rec, PyObject *entry) {
    PyObject *slots = PyObject_GetAttr(entry, s_slots);
    if (slots == NULL)
        return -1;
    if (!PyList_CheckExact(slots)) {
        Py_DECREF(slots);
        PyErr_SetString(PyExc_TypeError, "CacheEntry.slots: a list");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(slots); i++) {
        if (fill_one(rec, PyList_GET_ITEM(slots, i)) < 0) {
            Py_DECREF(slots);
            return -1;
        }
    }
    Py_DECREF(slots);
    return 0;
}

/* cache[key] = entry (the table starts over past `limit`), owner.entry = entry: the new record of it */
static PyObject *keep(Recorder *self, PyObject *owner, PyObject *key, PyObject *entry, PyObject *name,
                      PyObject *shape, PyObject *values, PyObject *rg) {
    if (PyDict_GET_SIZE(self->cache) > self->limit) {  /* the object table's rows hang on its entries */
        PyDict_Clear(self->cache);
        PyDict_Clear(self->objects);
    }
    if (PyDict_SetItem(self->cache, key, entry) < 0 || PyObject_SetAttr(owner, s_entry, entry) < 0)
        return NULL;
    return new_record(name, shape, values, rg);
}

/* the record handed out: `rec` itself when shared, else a copy the caller may extend */
static PyObject *hand_out(PyObject *rec, int shared) {
    if (shared)
        return rec;
    PyObject *copy = PyDict_Copy(rec);
    Py_DECREF(rec);
    return copy;
}

/* obj.name.append(v) for a list obj.name; 0, or -1 on error */
static int append_to(PyObject *obj, PyObject *name, PyObject *v) {
    PyObject *list = PyObject_GetAttr(obj, name);
    int err = -1;
    if (list != NULL && !PyList_CheckExact(list))
        PyErr_SetString(PyExc_TypeError, "Buffer: lists of rows");
    else if (list != NULL)
        err = PyList_Append(list, v);
    Py_XDECREF(list);
    return err;
}

/* Py_None, a new reference: "not this case, nothing changed", unless an error is set (then NULL) */
static PyObject *not_this_case(void) {
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* obj.name += k for an int obj.name: its new value, or -1 on error */
static Py_ssize_t add_to(PyObject *obj, PyObject *name, Py_ssize_t k) {
    PyObject *v = PyObject_GetAttr(obj, name);
    Py_ssize_t now = v == NULL ? -1 : PyLong_AsSsize_t(v);
    Py_XDECREF(v);
    if (now == -1 || (v = PyLong_FromSsize_t(now + k)) == NULL)
        return -1;
    int err = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return err < 0 ? -1 : now + k;
}

/* (values, [slot] or [slot, cslot]): what Summarizer._slots_of returns */
static PyObject *values_and_slots(PyObject *values, PyObject *slot, PyObject *cslot) {
    PyObject *slots = PyList_New(cslot == NULL ? 1 : 2), *result;
    if (slots == NULL)
        return NULL;
    Py_INCREF(slot);
    PyList_SET_ITEM(slots, 0, slot);
    if (cslot != NULL) {
        Py_INCREF(cslot);
        PyList_SET_ITEM(slots, 1, cslot);
    }
    result = PyTuple_Pack(2, values, slots);
    Py_DECREF(slots);
    return result;
}

/* Buffer.slot, inline: row `i` (`row`, its int) of `buf` for a tensor (the buffer's list `a` and, if not
 * NULL, `b` get `va` and `vb`: element count and dtype, or bytes; `fields` gets `values`): the slot (buf, row) */
static PyObject *take_row(PyObject *buf, Py_ssize_t i, PyObject *row, PyObject *a, PyObject *va, PyObject *b,
                          PyObject *vb, PyObject *values) {
    PyObject *next = PyLong_FromSsize_t(i + 1);
    int err = next == NULL || PyObject_SetAttr(buf, s_used, next) < 0 || append_to(buf, a, va) < 0
              || (b != NULL && append_to(buf, b, vb) < 0) || append_to(buf, s_fields, values) < 0;
    Py_XDECREF(next);
    return err ? NULL : PyTuple_Pack(2, buf, row);
}

/* The open buffer of `kind` in `open` (a lane's), with its next row `*i` (its int in `*row`, a new
 * reference), or NULL (none open, or full: Python opens the next; no error set) */
static PyObject *open_row(Recorder *self, PyObject *open, Py_ssize_t kind, Py_ssize_t *i, PyObject **row) {
    PyObject *buf = PyList_GET_ITEM(open, kind);
    if (buf == Py_None || (*row = PyObject_GetAttr(buf, s_used)) == NULL)
        return NULL;
    *i = PyLong_AsSsize_t(*row);
    if (*i < 0 || *i >= self->per_buffer) {
        Py_CLEAR(*row);
        return NULL;
    }
    return buf;
}

/* The device path's common case: a contiguous tensor whose statistics (with md5, and its checksum: both wait
 * as one item) wait, deferred, in the open buffers of its lane, whose kernels read its dtype dense
 * (`lane.fast[dtype]`, with md5 `lane.fast_md5[dtype]`: (group, itemsize), set by DeviceSummaries.stats and
 * .stats_checksum when they deferred such a tensor). What Summarizer._slots_of -> DeviceSummaries.stats (or
 * stats_checksum) -> Buffer.slot -> Deferral.add do, on the same objects: (values, slots); Py_None when it
 * is not this case (nothing changed), NULL on an error. */
static PyObject *defer_dense(Recorder *self, PyObject *t, PyObject *dtype, PyObject *device, PyObject *count,
                             Py_ssize_t n, PyObject *address, PyObject *version, PyObject *rg) {
    PyObject *lanes = NULL, *fast = NULL, *open = NULL, *row = NULL, *crow = NULL, *x = NULL, *values = NULL,
             *slot = NULL, *cslot = NULL, *item = NULL, *wait = NULL, *pair = NULL, *field = NULL, *size = NULL,
             *result = NULL;
    PyObject *lane, *plan, *buf, *cbuf = NULL;
    Py_ssize_t i, j = 0, itemsize, held;
    int both = self->md5;
    if ((lanes = PyObject_GetAttr(self->device, s_lanes)) == NULL)
        goto done;
    if ((lane = PyDict_GetItemWithError(lanes, device)) == NULL)
        goto other;
    if ((fast = PyObject_GetAttr(lane, both ? s_fast_md5 : s_fast)) == NULL || !PyDict_CheckExact(fast))
        goto other;
    plan = PyDict_GetItemWithError(fast, dtype);
    if (plan == NULL || !PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != 2)
        goto other;
    if ((open = PyObject_GetAttr(lane, s_open)) == NULL || !PyList_CheckExact(open) || PyList_GET_SIZE(open) != 2)
        goto other;
    if ((buf = open_row(self, open, 0, &i, &row)) == NULL
        || (both && (cbuf = open_row(self, open, 1, &j, &crow)) == NULL))
        goto other;
    itemsize = PyLong_AsSsize_t(PyTuple_GET_ITEM(plan, 1));
    if (itemsize <= 0)
        goto other;

    /* from here on the tables change: an error is an error */
    if ((x = rg == Py_False ? call0(t, s_detach) : (Py_INCREF(t), t)) == NULL
        || (values = PyDict_Copy(self->blank)) == NULL || (size = PyLong_FromSsize_t(n * itemsize)) == NULL
        || (slot = take_row(buf, i, row, s_ns, count, s_dtypes, dtype, values)) == NULL
        || (both && (cslot = take_row(cbuf, j, crow, s_nbytes, size, NULL, NULL, values)) == NULL))
        goto done;
    if (add_to(self->device, s_pending, 1 + both) < 0)
        goto done;
    Py_XSETREF(field, PyObject_GetAttr(self->device, s_memory));
    if (field == NULL || PySet_Add(field, address) < 0)
        goto done;
    if (both) {
        PyObject *stats = PyTuple_Pack(4, x, count, slot, Py_None), *crc = PyTuple_Pack(2, x, cslot);
        if (stats != NULL && crc != NULL)
            item = PyTuple_Pack(2, stats, crc);
        Py_XDECREF(stats);
        Py_XDECREF(crc);
    } else {
        item = PyTuple_Pack(4, x, count, slot, Py_None);
    }
    if (item == NULL || (wait = PyTuple_Pack(5, PyTuple_GET_ITEM(plan, 0), item, x, version, address)) == NULL
        || (pair = PyTuple_Pack(2, wait, size)) == NULL || PyList_Append(self->queue, pair) < 0)
        goto done;
    if ((held = add_to(self->deferral, s_held, n * itemsize)) < 0
        || (result = values_and_slots(values, slot, cslot)) == NULL)
        goto done;
    /* Deferral.add's "full": the batch goes now */
    if (PyList_GET_SIZE(self->queue) >= self->max_items || (self->max_bytes >= 0 && held >= self->max_bytes)) {
        PyObject *launched = PyObject_CallMethodNoArgs(self->device, s_launch);
        if (launched == NULL)
            Py_CLEAR(result);
        Py_XDECREF(launched);
    }
    goto done;
other:
    result = not_this_case();
done:
    Py_XDECREF(lanes);
    Py_XDECREF(fast);
    Py_XDECREF(open);
    Py_XDECREF(row);
    Py_XDECREF(crow);
    Py_XDECREF(x);
    Py_XDECREF(values);
    Py_XDECREF(slot);
    Py_XDECREF(cslot);
    Py_XDECREF(item);
    Py_XDECREF(wait);
    Py_XDECREF(pair);
    Py_XDECREF(field);
    Py_XDECREF(size);
    return result;
}

/* The device path's other common case on torch's kernels (NPU, the CPU the tests force): a contiguous tensor
 * whose statistics alone are taken now (not deferred: L0's module outputs), copied into the next row of its
 * lane's staging buffer of its dtype and shape (device.py's _Stage, made by the Python path), which already
 * waits and has a row after this one. What Summarizer._slots_of -> DeviceSummaries.stats -> _slot ->
 * Buffer.slot -> _stage do, on the same objects: (values, [slot]); Py_None when it is not this case (nothing
 * changed), NULL on an error. */
static PyObject *stage_dense(Recorder *self, PyObject *t, PyObject *dtype, PyObject *device, PyObject *shape,
                             PyObject *count, Py_ssize_t n, PyObject *rg) {
    PyObject *lanes = NULL, *open = NULL, *row = NULL, *kernels = NULL, *limit = NULL, *stages = NULL,
             *key = NULL, *used = NULL, *views = NULL, *x = NULL, *values = NULL, *slot = NULL, *field = NULL,
             *result = NULL;
    PyObject *lane, *stage = NULL, *buf;
    Py_ssize_t i, k, most;
    if ((lanes = PyObject_GetAttr(self->device, s_lanes)) == NULL)
        goto done;
    if ((lane = PyDict_GetItemWithError(lanes, device)) == NULL)
        goto other;
    /* the lane's kernels are torch's (None), `n` within its stage_max (a stage of the tensor's dtype and shape
     * that waits, below, says staging is on: the Python path made it) */
    if ((kernels = PyObject_GetAttr(lane, s_kernels)) == NULL || kernels != Py_None
        || (limit = PyObject_GetAttr(lane, s_stage_max)) == NULL)
        goto other;
    if ((most = PyLong_AsSsize_t(limit)) == -1 || n > most)
        goto other;
    if ((stages = PyObject_GetAttr(lane, s_stages)) == NULL || !PyDict_CheckExact(stages)
        || (key = PyTuple_Pack(2, dtype, shape)) == NULL || (stage = PyDict_GetItemWithError(stages, key)) == NULL)
        goto other;
    Py_INCREF(stage);  /* (borrowed from the lane's dict: held while Python code may run) */
    if ((used = PyObject_GetAttr(stage, s_used)) == NULL || (views = PyObject_GetAttr(stage, s_views)) == NULL
        || !PyTuple_CheckExact(views))
        goto other;
    k = PyLong_AsSsize_t(used);
    /* a stage with rows used and one after this (its first row queues it, its last launches: Python's) */
    if (k < 1 || k + 1 >= PyTuple_GET_SIZE(views))
        goto other;
    if ((open = PyObject_GetAttr(lane, s_open)) == NULL || !PyList_CheckExact(open) || PyList_GET_SIZE(open) != 2
        || (buf = open_row(self, open, 0, &i, &row)) == NULL)
        goto other;

    /* from here on the tables change: an error is an error */
    if ((values = PyDict_Copy(self->blank)) == NULL
        || (slot = take_row(buf, i, row, s_ns, count, s_dtypes, dtype, values)) == NULL)
        goto done;
    if (add_to(self->device, s_pending, 1) < 0)
        goto done;
    /* (detached: a copy from a tensor that requires grad would put the stage in the graph) */
    if ((x = rg == Py_True ? call0(t, s_detach) : (Py_INCREF(t), t)) == NULL)
        goto done;
    Py_XSETREF(field, PyObject_CallMethodOneArg(PyTuple_GET_ITEM(views, k), s_copy_, x));
    if (field == NULL)
        goto done;
    Py_XSETREF(field, PyLong_FromSsize_t(k + 1));
    if (field == NULL || PyObject_SetAttr(stage, s_used, field) < 0 || append_to(stage, s_slots, slot) < 0)
        goto done;
    result = values_and_slots(values, slot, NULL);
    goto done;
other:
    result = not_this_case();
done:
    Py_XDECREF(lanes);
    Py_XDECREF(open);
    Py_XDECREF(row);
    Py_XDECREF(kernels);
    Py_XDECREF(limit);
    Py_XDECREF(stages);
    Py_XDECREF(key);
    Py_XDECREF(stage);
    Py_XDECREF(used);
    Py_XDECREF(views);
    Py_XDECREF(x);
    Py_XDECREF(values);
    Py_XDECREF(slot);
    Py_XDECREF(field);
    return result;
}

#define SPAN_DIMS 64

/* `shape` and `strides` (tuples of one length) into `sizes` and `steps`: their length, or -1 (no error
 * set) when they are not such tuples or have more dimensions than SPAN_DIMS */
static int read_layout(PyObject *shape, PyObject *strides, Py_ssize_t *sizes, Py_ssize_t *steps) {
    if (!PyTuple_Check(shape) || !PyTuple_Check(strides) || PyTuple_GET_SIZE(strides) != PyTuple_GET_SIZE(shape)
        || PyTuple_GET_SIZE(shape) > SPAN_DIMS)
        return -1;
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    for (Py_ssize_t i = 0; i < nd; i++) {
        sizes[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        steps[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(strides, i));
        if ((sizes[i] == -1 || steps[i] == -1) && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
    }
    return (int)nd;
}

/* layout.element_span(t) from its shape and strides: ((stride, size), ...) in memory order, size-1
 * dimensions dropped, a dimension merged into the one outside it when it steps over it exactly; NULL
 * (no error set) when it has more dimensions than this reads. `*rows` > 0 when the kernel reads it as
 * host.statistics does: `*rows` runs of `*run` elements `*row_stride` apart (one dense run: a transpose;
 * rows that do not overlap: a chunk of a wider tensor), else 0. */
static PyObject *element_span(PyObject *shape, PyObject *strides, Py_ssize_t *run, Py_ssize_t *rows,
                              Py_ssize_t *row_stride) {
    *rows = 0;
    Py_ssize_t m = 0, st[SPAN_DIMS], sz[SPAN_DIMS], sizes[SPAN_DIMS], steps[SPAN_DIMS];
    int nd = read_layout(shape, strides, sizes, steps);
    if (nd < 0)
        return NULL;
    for (int i = 0; i < nd; i++) {
        Py_ssize_t size = sizes[i], stride = steps[i];
        if (size == 1)
            continue;
        /* insertion sort, descending by (stride, size): sorted(..., reverse=True) */
        Py_ssize_t j = m++;
        while (j > 0 && (st[j - 1] < stride || (st[j - 1] == stride && sz[j - 1] < size))) {
            st[j] = st[j - 1];
            sz[j] = sz[j - 1];
            j--;
        }
        st[j] = stride;
        sz[j] = size;
    }
    Py_ssize_t k = 0;  /* merged in place */
    for (Py_ssize_t i = 0; i < m; i++) {
        if (k > 0 && st[k - 1] == st[i] * sz[i]) {
            st[k - 1] = st[i];
            sz[k - 1] *= sz[i];
        } else {
            st[k] = st[i];
            sz[k] = sz[i];
            k++;
        }
    }
    if (k == 1 && st[0] == 1) {
        *run = *row_stride = sz[0];
        *rows = 1;
    } else if (k == 2 && st[1] == 1 && st[0] >= sz[1]) {
        *run = sz[1];
        *rows = sz[0];
        *row_stride = st[0];
    }
    PyObject *span = PyTuple_New(k);
    if (span == NULL) {
        PyErr_Clear();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *pair = Py_BuildValue("(nn)", st[i], sz[i]);
        if (pair == NULL) {
            PyErr_Clear();
            Py_DECREF(span);
            return NULL;
        }
        PyTuple_SET_ITEM(span, i, pair);
    }
    return span;
}

/* t.numel() from its shape (torch.Size, a tuple of ints): no method call through torch's argument parser;
 * -1 with an error set when a size is not an int */
static Py_ssize_t elements(PyObject *shape) {
    if (!PyTuple_Check(shape)) {
        PyErr_SetString(PyExc_TypeError, "a tensor's shape is not a tuple");
        return -1;
    }
    Py_ssize_t n = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++) {
        Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        if (d < 0)
            return -1;
        n *= d;
    }
    return n;
}

/* Reads of `t` that fail (a tensor without storage, say) send it to the Python path, which says why. */
#define READ(var, expr) do { if ((var = (expr)) == NULL) goto python; } while (0)

static PyObject *record(Recorder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 3 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "record(owner, tensor, shared, defer=False, keyed=False)");
        return NULL;
    }
    PyObject *owner = args[0], *t = args[1], *result = NULL, *defer = nargs >= 4 ? args[3] : Py_False;
    int shared = PyObject_IsTrue(args[2]), keyed = nargs == 5 ? PyObject_IsTrue(args[4]) : 0;
    if (shared < 0 || keyed < 0)
        return NULL;
    PyObject *tid = NULL, *seen = NULL, *version = NULL, *ptr = NULL, *shape = NULL, *dtype = NULL, *flag = NULL,
             *count = NULL, *device = NULL, *storage = NULL, *key = NULL, *hit = NULL, *field = NULL,
             *values = NULL, *entry = NULL, *ref = NULL, *rec = NULL, *rg = NULL, *span = NULL, *strides = NULL;
    int eq;

    /* 1. the same tensor object (an API's input is usually the previous API's output) */
    tid = PyLong_FromVoidPtr(t);
    if (tid == NULL)
        return NULL;
    seen = PyDict_GetItemWithError(self->objects, tid);
    if (seen == NULL && PyErr_Occurred())
        goto done;
    Py_XINCREF(seen);  /* held: reading `t` may run code that changes the table */
    if (seen != NULL && PyTuple_CheckExact(seen) && PyTuple_GET_SIZE(seen) == 5
        && PyWeakref_GetObject(PyTuple_GET_ITEM(seen, 0)) == t) {
        READ(version, PyObject_GetAttr(t, s_version));
        /* the entry's version: `forget` (a change through another tensor object) invalidates the entry */
        READ(field, PyObject_GetAttr(PyTuple_GET_ITEM(seen, 4), s_entry_version));
        eq = PyObject_RichCompareBool(field, version, Py_EQ);
        Py_XSETREF(field, NULL);
        if (eq < 0)
            goto python;
        if (eq) {
            READ(ptr, call0(t, s_data_ptr));
            READ(shape, PyObject_GetAttr(t, s_shape));
            if ((eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(seen, 1), ptr, Py_EQ)) > 0)
                eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(seen, 2), shape, Py_EQ);
            if (eq < 0)
                goto python;
        }
        if (eq) {
            PyObject *old = PyTuple_GET_ITEM(seen, 3);
            entry = PyTuple_GET_ITEM(seen, 4);
            Py_INCREF(entry);
            int complete = no_slots(entry);
            if (complete < 0)
                goto python;
            READ(rg, PyObject_GetAttr(t, s_requires_grad));
            if (PyObject_SetAttr(owner, s_entry, entry) < 0)
                goto done;
            PyObject *was = PyDict_GetItemWithError(old, s_requires_grad);
            if (was == NULL && PyErr_Occurred())
                goto done;
            if (was == rg && (shared || complete)) {  /* (bools: `is`) shared: its fields filled in place */
                Py_INCREF(old);
                result = hand_out(old, shared);
            } else if ((result = PyDict_Copy(old)) != NULL && was != rg
                       && PyDict_SetItem(result, s_requires_grad, rg) < 0) {
                Py_CLEAR(result);
            }
            /* a dict of its own: its fields still on a device are filled when resolved too */
            if (result != NULL && result != old && !complete && fill_slots(result, entry) < 0)
                Py_CLEAR(result);
            goto done;
        }
    }

    /* 2. a plain dense CPU tensor: the memory-keyed cache, else the kernel; 3. elsewhere: else device slots */
    if (Py_TYPE(t) != (PyTypeObject *)self->tensor && Py_TYPE(t) != (PyTypeObject *)self->parameter)
        goto python;
    READ(dtype, PyObject_GetAttr(t, s_dtype));
    PyObject *name = PyDict_GetItemWithError(self->names, dtype);  /* filled by the Python path */
    if (name == NULL)
        goto python;
    READ(flag, PyObject_GetAttr(t, s_layout));
    if (flag != self->strided)
        goto python;
    Py_SETREF(flag, NULL);
    /* an inference tensor has no version counter: reading it raises, and the Python path takes it (a
     * getter: cheaper than asking is_inference(), and every keyed record needs the version) */
    if (version == NULL)
        READ(version, PyObject_GetAttr(t, s_version));
    READ(flag, PyObject_GetAttr(t, s_is_cpu));
    int host = flag == Py_True && self->small > 0;  /* case 2, else 3 */
    Py_SETREF(flag, NULL);
    if (shape == NULL)
        READ(shape, PyObject_GetAttr(t, s_shape));
    Py_ssize_t n = elements(shape);
    if (n <= 1)  /* (-1: an error) one element keys by its layout */
        goto python;
    if ((count = PyLong_FromSsize_t(n)) == NULL)
        goto done;
    READ(flag, call0(t, s_is_contiguous));
    if (ptr == NULL)
        READ(ptr, call0(t, s_data_ptr));
    /* 2a. a small dense host tensor, its entry not asked for: read again, no key, entry or table row */
    int unkeyed = host && flag == Py_True && n < self->unkeyed && !keyed;
    /* how the kernel reads it: one dense run, unless a view that is not in index order says otherwise */
    Py_ssize_t run = n, rows = 1, row_stride = n;
    if (flag != Py_True) {
        /* (a transpose, a chunk of a wider tensor): keyed by the elements it covers, as memory_key keys
         * it; with md5 by its layout (the checksum reads them in index order), the device path's by Python */
        if (self->md5 && !host)
            goto python;
        READ(strides, call0(t, s_stride));
        span = element_span(shape, strides, &run, &rows, &row_stride);
        if (span == NULL)
            goto python;
    }
    READ(rg, PyObject_GetAttr(t, s_requires_grad));
    if (unkeyed)
        goto read;
    READ(device, PyObject_GetAttr(t, s_device));
    READ(storage, call0(t, s_untyped_storage));
    /* (data_ptr, dtype, device, span): memory_key's key, a dense run's span ((1, n),); with md5 a view's
     * is exact_key's (data_ptr, dtype, shape, strides, device) */
    if ((key = span == NULL ? Py_BuildValue("(OOO((nn)))", ptr, dtype, device, (Py_ssize_t)1, n)
                            : self->md5 ? PyTuple_Pack(5, ptr, dtype, shape, strides, device)
                                        : PyTuple_Pack(4, ptr, dtype, device, span)) == NULL)
        goto done;
    hit = PyDict_GetItemWithError(self->cache, key);
    if (hit == NULL && PyErr_Occurred())
        goto done;
    Py_XINCREF(hit);
    if (hit != NULL) {
        /* the same storage, alive, at the same version: the memory was not freed and reused since */
        READ(field, PyObject_GetAttr(hit, s_entry_version));
        if ((eq = PyObject_RichCompareBool(field, version, Py_EQ)) < 0)
            goto python;
        Py_XSETREF(field, NULL);
        if (eq) {
            READ(ref, PyObject_GetAttr(hit, s_ref));
            eq = PyWeakref_Check(ref) && PyWeakref_GetObject(ref) == storage;
            Py_SETREF(ref, NULL);  /* (`ref` is the new entry's below) */
        }
        if (eq) {
            int complete = no_slots(hit);
            if (complete < 0)
                goto python;
            READ(values, PyObject_GetAttr(hit, s_values));
            /* fields still on a device: this record, and a copy handed out, are filled when resolved */
            if (PyObject_SetAttr(owner, s_entry, hit) < 0 || (rec = new_record(name, shape, values, rg)) == NULL
                || (!complete && fill_slots(rec, hit) < 0) || remember(self, tid, t, ptr, shape, rec, hit) < 0)
                goto done;
            result = hand_out(rec, shared);
            rec = NULL;
            if (result != NULL && !shared && !complete && fill_slots(result, hit) < 0)
                Py_CLEAR(result);
            goto done;
        }
    }
    if (!host) {
        /* 3. device slots: nothing may send it to the Python path once they are made (the weak
         * reference first: a storage without one is the Python path's, which keeps no entry) */
        if ((ref = PyWeakref_NewRef(storage, NULL)) == NULL)
            goto python;
        PyObject *address = call0(storage, s_data_ptr), *got = NULL;
        if (address == NULL)
            goto python;
        int deferred = PyObject_IsTrue(defer);
        if (self->device != NULL && span == NULL && self->stats && deferred >= 0 && (deferred || !self->md5)) {
            got = deferred ? defer_dense(self, t, dtype, device, count, n, address, version, rg)
                           : stage_dense(self, t, dtype, device, shape, count, n, rg);
            if (got == Py_None)
                Py_CLEAR(got);
            else if (got == NULL) {
                Py_DECREF(address);
                goto done;
            }
        }
        if (got == NULL) {
            PyObject *call[6] = {owner, t, count, PyTuple_GET_ITEM(key, 3), address, defer};
            got = PyObject_VectorcallMethod(s_slots_of, call, 6, NULL);  /* (no ARGUMENTS_OFFSET: see call0) */
        }
        Py_DECREF(address);
        if (got == NULL)
            goto done;
        if (!PyTuple_CheckExact(got) || PyTuple_GET_SIZE(got) != 2) {
            Py_DECREF(got);
            PyErr_SetString(PyExc_TypeError, "_slots_of: (values, slots)");
            goto done;
        }
        values = PyTuple_GET_ITEM(got, 0);
        Py_INCREF(values);
        entry = PyObject_CallFunctionObjArgs(self->entry_type, ref, version, values, PyTuple_GET_ITEM(got, 1), NULL);
        Py_DECREF(got);
        if (entry == NULL)
            goto done;
        if ((hit != NULL && PyObject_SetAttr(hit, s_entry_version, minus_one) < 0)
            || (rec = keep(self, owner, key, entry, name, shape, values, rg)) == NULL
            || fill_slots(rec, entry) < 0 || remember(self, tid, t, ptr, shape, rec, entry) < 0)
            goto done;
        result = hand_out(rec, shared);
        rec = NULL;
        if (result != NULL && !shared && fill_slots(result, entry) < 0)
            Py_CLEAR(result);
        goto done;
    }
read:
    if ((values = PyDict_New()) == NULL)
        goto done;
    void *address = PyLong_AsVoidPtr(ptr);
    if (address == NULL)
        goto python;
    /* one thread below `small` (host.PARALLEL_MIN): a parallel read would cost more than it saves */
    long threads = 1;
    if (n >= self->small) {
        PyObject *asked = PyObject_CallNoArgs(self->threads);
        if (asked == NULL)
            goto done;
        threads = PyLong_AsLong(asked);
        Py_DECREF(asked);
        if (threads == -1 && PyErr_Occurred())
            goto done;
    }
    if (self->stats) {
        PyObject *kind = PyDict_GetItemWithError(self->kinds, dtype);
        double got[4];
        if (kind == NULL || rows == 0)  /* (rows 0: a layout host.statistics reads otherwise) */
            goto python;
        int k = (int)PyLong_AsLong(kind);
        if (!kernel(address, run, k, threads, rows, row_stride, got))
            goto python;  /* a NaN or inf (or an integer beyond 2^53): torch's reductions say how it shows */
        PyObject *const names[4] = {s_max, s_min, s_mean, s_norm};
        for (int i = 0; i < 4; i++) {
            /* an integer tensor's Max and Min are ints, as torch's reductions give them */
            PyObject *v = i < 2 && k >= MOMENTS_FIRST_INT ? PyLong_FromDouble(got[i]) : PyFloat_FromDouble(got[i]);
            if (v == NULL || PyDict_SetItem(values, names[i], v) < 0) {
                Py_XDECREF(v);
                goto done;
            }
            Py_DECREF(v);
        }
    }
    if (self->md5) {
        /* host.crc32_of's case, inline: the CRC-32 of the tensor's elements in index order as 8 hex digits
           (the memory of a negative view is not its values: the Python path reads a resolved copy) */
        PyObject *got = call0(t, s_is_neg);
        if (got == NULL)
            goto python;
        int negative = got != Py_False;
        Py_DECREF(got);
        if (negative)
            goto python;
        if ((got = call0(t, s_element_size)) == NULL)
            goto python;
        Py_ssize_t itemsize = PyLong_AsSsize_t(got), sizes[SPAN_DIMS], steps[SPAN_DIMS];
        Py_DECREF(got);
        int nd = 1;
        sizes[0] = n;
        steps[0] = 1;
        if (strides != NULL && (nd = read_layout(shape, strides, sizes, steps)) < 0)
            goto python;
        unsigned long crc;
        /* `t`, held by the caller, holds the memory; 0: a layout msprobe._crc leaves to the Python path's copy */
        if (itemsize <= 0 || !crc_read((const char *)address, itemsize, nd, sizes, steps, threads, &crc))
            goto python;
        char hex[16];
        snprintf(hex, sizeof hex, "%08lx", crc & 0xFFFFFFFFUL);
        if ((field = PyUnicode_FromStringAndSize(hex, 8)) == NULL || PyDict_SetItem(values, s_md5, field) < 0)
            goto done;
    }
    if (unkeyed) {
        if (PyObject_SetAttr(owner, s_entry, Py_None) == 0)
            result = new_record(name, shape, values, rg);
        goto done;
    }
    /* a storage without weak references: the Python path keeps no entry for it */
    if ((ref = PyWeakref_NewRef(storage, NULL)) == NULL)
        goto python;
    PyObject *slots = PyList_New(0);
    if (slots == NULL)
        goto done;
    entry = PyObject_CallFunctionObjArgs(self->entry_type, ref, version, values, slots, NULL);
    Py_DECREF(slots);
    if (entry == NULL)
        goto done;
    /* replaced: a tensor object whose row holds the old entry reads its memory again (see forget) */
    if ((hit != NULL && PyObject_SetAttr(hit, s_entry_version, minus_one) < 0)
        || (rec = keep(self, owner, key, entry, name, shape, values, rg)) == NULL
        || remember(self, tid, t, ptr, shape, rec, entry) < 0)
        goto done;
    result = hand_out(rec, shared);
    rec = NULL;
    goto done;

python:
    /* nothing changed yet: errors here come from reading the tensor, which the Python path meets again */
    PyErr_Clear();
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(tid);
    Py_XDECREF(seen);
    Py_XDECREF(version);
    Py_XDECREF(ptr);
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(flag);
    Py_XDECREF(count);
    Py_XDECREF(device);
    Py_XDECREF(storage);
    Py_XDECREF(key);
    Py_XDECREF(hit);
    Py_XDECREF(field);
    Py_XDECREF(values);
    Py_XDECREF(entry);
    Py_XDECREF(ref);
    Py_XDECREF(rec);
    Py_XDECREF(rg);
    Py_XDECREF(span);
    Py_XDECREF(strides);
    return result;
}

static PyObject *recorder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    Recorder *self = (Recorder *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    PyObject *device = Py_None, *blank = NULL;
    self->per_buffer = self->unkeyed = 0;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!OOnnOpp|OO!nn:Recorder", &PyDict_Type, &self->objects, &PyDict_Type,
                          &self->cache, &PyDict_Type, &self->names, &PyDict_Type, &self->kinds, &PyType_Type,
                          &self->tensor, &PyType_Type, &self->parameter, &self->strided, &self->entry_type,
                          &self->limit, &self->small, &self->threads, &self->stats, &self->md5,
                          &device, &PyDict_Type, &blank, &self->per_buffer, &self->unkeyed)) {
        self->objects = self->cache = self->names = self->kinds = NULL;
        self->tensor = self->parameter = self->strided = self->entry_type = NULL;
        self->threads = NULL;
        Py_DECREF(self);
        return NULL;
    }
    /* the device path's common case: `device` (DeviceSummaries), `blank` (a record's value fields), `per_buffer`
     * (slots per buffer); its Deferral's bounds are read once (constants of the session) */
    self->device = self->deferral = self->queue = self->blank = NULL;
    if (device != Py_None && blank != NULL && self->per_buffer > 0) {
        PyObject *deferral = PyObject_GetAttrString(device, "_waiting"), *queue = NULL, *bound = NULL;
        if (deferral != NULL && (queue = PyObject_GetAttrString(deferral, "queue")) != NULL && PyList_CheckExact(queue)
            && (bound = PyObject_GetAttrString(deferral, "max_items")) != NULL
            && (self->max_items = PyLong_AsSsize_t(bound)) != -1) {
            Py_SETREF(bound, PyObject_GetAttrString(deferral, "max_bytes"));
            self->max_bytes = bound == NULL ? -1 : bound == Py_None ? -1 : PyLong_AsSsize_t(bound);
        }
        if (bound != NULL && !PyErr_Occurred()) {
            self->device = device;
            self->deferral = deferral;
            self->queue = queue;
            self->blank = blank;
            Py_INCREF(device);
            Py_INCREF(blank);
        } else {
            Py_XDECREF(deferral);
            Py_XDECREF(queue);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "Recorder: a DeviceSummaries with a Deferral of a list queue");
        }
        Py_XDECREF(bound);
        if (PyErr_Occurred()) {
            Py_DECREF(self);
            return NULL;
        }
    }
    Py_INCREF(self->objects);
    Py_INCREF(self->cache);
    Py_INCREF(self->names);
    Py_INCREF(self->kinds);
    Py_INCREF(self->tensor);
    Py_INCREF(self->parameter);
    Py_INCREF(self->strided);
    Py_INCREF(self->entry_type);
    Py_INCREF(self->threads);
    return (PyObject *)self;
}

/* garbage-collected: the tables it holds hold records, entries and weak references of any kind */
static int recorder_traverse(Recorder *self, visitproc visit, void *arg) {
    Py_VISIT(self->objects);
    Py_VISIT(self->cache);
    Py_VISIT(self->names);
    Py_VISIT(self->kinds);
    Py_VISIT(self->tensor);
    Py_VISIT(self->parameter);
    Py_VISIT(self->strided);
    Py_VISIT(self->entry_type);
    Py_VISIT(self->threads);
    Py_VISIT(self->device);
    Py_VISIT(self->deferral);
    Py_VISIT(self->queue);
    Py_VISIT(self->blank);
    return 0;
}

static int recorder_clear(Recorder *self) {
    Py_CLEAR(self->objects);
    Py_CLEAR(self->cache);
    Py_CLEAR(self->names);
    Py_CLEAR(self->kinds);
    Py_CLEAR(self->tensor);
    Py_CLEAR(self->parameter);
    Py_CLEAR(self->strided);
    Py_CLEAR(self->entry_type);
    Py_CLEAR(self->threads);
    Py_CLEAR(self->device);
    Py_CLEAR(self->deferral);
    Py_CLEAR(self->queue);
    Py_CLEAR(self->blank);
    return 0;
}

static void recorder_dealloc(Recorder *self) {
    PyObject_GC_UnTrack(self);
    recorder_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* fill_stats(fields, ns, dtypes, codes, address): readback.fill_stats in C. Row i of the float64 rows at
 * `address` (max, min, sum, sum of squares of a tensor of ns[i] elements of dtypes[i]) into dict fields[i]:
 * Max, Min, Mean (sum / n), Norm (the square root of the sum of squares); `codes` maps a dtype to FILL_EXACT
 * (float64), FILL_LOW (a float reported in float32: Mean and Norm rounded to it within its range), FILL_INT
 * (Max and Min as ints when finite) or FILL_BOOL (Max and Min as bools, no Mean or Norm). A row with a NaN
 * or inf has them as json_float's strings, and NaN in both Max and Min when either is NaN. The caller
 * keeps the rows alive and knows there are len(ns) of them. */
enum { FILL_EXACT, FILL_LOW, FILL_INT, FILL_BOOL };
static PyObject *s_nan_text, *s_inf_text, *s_minus_inf_text;

static PyObject *json_float_of(double x) {
    if (isfinite(x))
        return PyFloat_FromDouble(x);
    PyObject *text = x != x ? s_nan_text : (x > 0 ? s_inf_text : s_minus_inf_text);
    Py_INCREF(text);
    return text;
}

static double in_float32(double x, int low) {
    return low && fabs(x) <= FLT_MAX ? (double)(float)x : x;
}

static int set_field(PyObject *rec, PyObject *name, PyObject *value) {
    if (value == NULL)
        return -1;
    int rc = PyDict_SetItem(rec, name, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *fill_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) || !PyList_CheckExact(args[2])
        || !PyDict_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "fill_stats(fields: list, ns: list, dtypes: list, codes: dict, address: int)");
        return NULL;
    }
    PyObject *fields = args[0], *ns = args[1], *dtypes = args[2], *codes = args[3];
    Py_ssize_t k = PyList_GET_SIZE(ns);
    if (PyList_GET_SIZE(fields) < k || PyList_GET_SIZE(dtypes) < k) {
        PyErr_SetString(PyExc_ValueError, "fill_stats: fewer fields or dtypes than rows");
        return NULL;
    }
    const double *rows = (const double *)PyLong_AsVoidPtr(args[4]);
    if (rows == NULL && PyErr_Occurred())
        return NULL;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *rec = PyList_GET_ITEM(fields, i);
        PyObject *code_obj = PyDict_GetItemWithError(codes, PyList_GET_ITEM(dtypes, i));
        if (!PyDict_Check(rec) || code_obj == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "fill_stats: row %zd has no dict or no code for its dtype", i);
            return NULL;
        }
        long code = PyLong_AsLong(code_obj);
        double n = PyFloat_AsDouble(PyList_GET_ITEM(ns, i));
        if ((code == -1 || n == -1.0) && PyErr_Occurred())
            return NULL;
        const double *r = rows + 4 * i;
        double mx = r[0], mn = r[1];
        int low = code == FILL_LOW;
        double mean = in_float32(r[2] / n, low), norm = in_float32(sqrt(r[3]), low);
        PyObject *vmx, *vmn, *vmean, *vnorm;
        if (code == FILL_BOOL) {
            vmx = PyBool_FromLong(mx != 0.0);
            vmn = PyBool_FromLong(mn != 0.0);
            vmean = Py_NewRef(Py_None);
            vnorm = Py_NewRef(Py_None);
        } else if (isfinite(mx) && isfinite(mn) && isfinite(r[2]) && isfinite(r[3])) {
            vmx = code == FILL_INT ? PyLong_FromDouble(mx) : PyFloat_FromDouble(mx);
            vmn = code == FILL_INT ? PyLong_FromDouble(mn) : PyFloat_FromDouble(mn);
            vmean = PyFloat_FromDouble(mean);
            vnorm = PyFloat_FromDouble(norm);
        } else {
            if (mx != mx || mn != mn)  /* a NaN: torch's max and min say nan */
                mx = mn = NAN;
            int ints = code == FILL_INT && isfinite(mx) && isfinite(mn);
            vmx = ints ? PyLong_FromDouble(mx) : json_float_of(mx);
            vmn = ints ? PyLong_FromDouble(mn) : json_float_of(mn);
            vmean = json_float_of(mean);
            vnorm = json_float_of(norm);
        }
        /* (each consumes its value, even after a failure) */
        int bad = set_field(rec, s_max, vmx) < 0;
        bad |= set_field(rec, s_min, vmn) < 0;
        bad |= set_field(rec, s_mean, vmean) < 0;
        bad |= set_field(rec, s_norm, vnorm) < 0;
        if (bad)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* fill_waiting(fields, fills): readback's fill of the records that wait for rows, each (row, record): record
 * updated with fields[row]. */
static PyObject *fill_waiting(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "fill_waiting(fields: list, fills: list)");
        return NULL;
    }
    PyObject *fields = args[0], *fills = args[1];
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(fills); j++) {
        PyObject *pair = PyList_GET_ITEM(fills, j);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyDict_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_SetString(PyExc_TypeError, "fill_waiting: fills are (row, record dict) pairs");
            return NULL;
        }
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
        if (i == -1 && PyErr_Occurred())
            return NULL;
        if (i < 0 || i >= PyList_GET_SIZE(fields)) {
            PyErr_Format(PyExc_IndexError, "fill_waiting: row %zd of %zd", i, PyList_GET_SIZE(fields));
            return NULL;
        }
        if (PyDict_Update(PyTuple_GET_ITEM(pair, 1), PyList_GET_ITEM(fields, i)) < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"fill_stats", (PyCFunction)(void (*)(void))fill_stats, METH_FASTCALL,
     "fill_stats(fields, ns, dtypes, codes, address): statistics rows into record fields (readback.fill_stats)."},
    {"fill_waiting", (PyCFunction)(void (*)(void))fill_waiting, METH_FASTCALL,
     "fill_waiting(fields, fills): each waiting (row, record) updated with fields[row]."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef recorder_methods[] = {
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL,
     "record(owner, tensor, shared, defer=False) -> the tensor's record, or None: the Python path takes it."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "msprobe._record.Recorder",
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Summarizer.record's common cases over one summarizer's tables (see the module source).",
    .tp_new = recorder_new,
    .tp_traverse = (traverseproc)recorder_traverse,
    .tp_clear = (inquiry)recorder_clear,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_methods = recorder_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_record", NULL, -1, module_methods};

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__record(void) {
    /* the statistics kernel: msprobe._moments' own (no second copy); without it no module */
    /* (imported first: PyCapsule_Import reads the attribute off the package, set only once it is imported;
     * a failure is an ImportError, which the summarizer's fallback catches) */
    PyObject *moments = PyImport_ImportModule("msprobe._moments");
    if (moments == NULL)
        return NULL;
    Py_DECREF(moments);
    moments_kernel *got = (moments_kernel *)PyCapsule_Import(MOMENTS_CAPSULE, 0);
    if (got == NULL)
        return NULL;
    kernel = *got;
    /* the CRC: msprobe._crc's (its library function set up by core/checksum.py, imported by the summarizer) */
    PyObject *crc = PyImport_ImportModule("msprobe._crc");
    if (crc == NULL)
        return NULL;
    Py_DECREF(crc);
    crc_strided *reader = (crc_strided *)PyCapsule_Import(CRC_CAPSULE, 0);
    if (reader == NULL)
        return NULL;
    crc_read = *reader;
    INTERN(s_slots_of, "_slots_of");
    INTERN(s_version, "_version");
    INTERN(s_is_neg, "is_neg");
    INTERN(s_element_size, "element_size");
    INTERN(s_data_ptr, "data_ptr");
    INTERN(s_shape, "shape");
    INTERN(s_dtype, "dtype");
    INTERN(s_layout, "layout");
    INTERN(s_is_cpu, "is_cpu");
    INTERN(s_is_contiguous, "is_contiguous");
    INTERN(s_stride, "stride");
    INTERN(s_device, "device");
    INTERN(s_untyped_storage, "untyped_storage");
    INTERN(s_requires_grad, "requires_grad");
    INTERN(s_slots, "slots");
    INTERN(s_ref, "ref");
    INTERN(s_entry_version, "version");
    INTERN(s_entry, "entry");
    INTERN(s_values, "values");
    INTERN(s_type, "type");
    INTERN(s_torch_tensor, "torch.Tensor");
    INTERN(s_max, "Max");
    INTERN(s_min, "Min");
    INTERN(s_mean, "Mean");
    INTERN(s_norm, "Norm");
    INTERN(s_md5, "md5");
    INTERN(s_lanes, "_lanes");
    INTERN(s_fast, "fast");
    INTERN(s_kernels, "kernels");
    INTERN(s_stage_max, "stage_max");
    INTERN(s_stages, "stages");
    INTERN(s_views, "views");
    INTERN(s_copy_, "copy_");
    INTERN(s_fast_md5, "fast_md5");
    INTERN(s_nbytes, "nbytes");
    INTERN(s_open, "open");
    INTERN(s_used, "used");
    INTERN(s_ns, "ns");
    INTERN(s_dtypes, "dtypes");
    INTERN(s_fields, "fields");
    INTERN(s_fills, "fills");
    INTERN(s_pending, "pending");
    INTERN(s_memory, "_memory");
    INTERN(s_held, "held");
    INTERN(s_launch, "launch");
    INTERN(s_detach, "detach");
    INTERN(s_nan_text, "nan");
    INTERN(s_inf_text, "inf");
    INTERN(s_minus_inf_text, "-inf");
    if ((minus_one = PyLong_FromLong(-1)) == NULL)
        return NULL;
    if (PyType_Ready(&RecorderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RecorderType);
    if (PyModule_AddObject(m, "Recorder", (PyObject *)&RecorderType) < 0) {
        Py_DECREF(&RecorderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
