/* zlib's CRC-32 of a tensor's elements in index order, read where they lie: a contiguous tensor in one
   stream, a view (a chunk of a fused projection, heads transposed) as its dense runs one after another,
   without the contiguous copy. The CRC itself is a library's: ISA-L's `crc32_gzip_refl` (or zlib's
   `crc32_z`), called through the address core/checksum.py hands `configure`; both take the CRC so far,
   so runs chain. Large reads are cut into one stretch a thread (OpenMP's team where the build has it: in
   a PyTorch process torch's own pool) and the parts joined with zlib's `crc32_combine64`.

   configure(crc_address, combine_address): the library functions (0: none)
   crc32(address, itemsize, shape, strides, threads) -> int, or None: not read here (see crc.h)
   _strided: a capsule of the same for C callers (crc.h)
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "crc.h"

/* outer (non-dense) dimensions walked; a view with more is copied by the caller */
#define MAX_DIMS 16
#define MAX_THREADS 8
/* dense runs shorter than this cost more in calls than a contiguous copy does */
#define MIN_RUN_BYTES 64
/* below this many bytes a thread, handing work over costs more than it saves */
#define MIN_PER_THREAD (256 * 1024)
#define GIL_RELEASE_MIN (256 * 1024)

/* the CRC so far, bytes, length -> the CRC with them (ISA-L's and zlib's signature on LP64 platforms) */
typedef unsigned long (*crc_function)(unsigned long, const unsigned char *, size_t);
/* crc(A), crc(B), len(B) -> crc(A || B) */
typedef unsigned long (*combine_function)(unsigned long, unsigned long, int64_t);

static crc_function crc_of;
static combine_function combine;

/* the bytes of a view as a stream: `nd` outer dimensions (outermost first, byte strides) over dense runs */
typedef struct {
    const char *base;
    int nd;
    Py_ssize_t size[MAX_DIMS], step[MAX_DIMS], run;
} Layout;

typedef struct {
    const Layout *layout;
    Py_ssize_t lo, hi;  /* bytes [lo, hi) of the stream */
    unsigned long crc;
} Part;

static void crc_part(Part *part) {
    const Layout *l = part->layout;
    Py_ssize_t r = part->lo / l->run, off = part->lo % l->run, at[MAX_DIMS], left = part->hi - part->lo;
    const char *p = l->base;
    for (int d = l->nd - 1; d >= 0; d--) {  /* run r's place */
        at[d] = r % l->size[d];
        r /= l->size[d];
        p += at[d] * l->step[d];
    }
    unsigned long crc = 0;
    while (left > 0) {
        Py_ssize_t take = l->run - off < left ? l->run - off : left;
        crc = crc_of(crc, (const unsigned char *)p + off, (size_t)take) & 0xFFFFFFFFUL;
        left -= take;
        off = 0;
        for (int d = l->nd - 1; d >= 0; d--) {  /* the next run, in index order */
            p += l->step[d];
            if (++at[d] < l->size[d])
                break;
            p -= l->step[d] * l->size[d];
            at[d] = 0;
        }
    }
    part->crc = crc;
}

static int strided(const char *base, Py_ssize_t itemsize, int ndim, const Py_ssize_t *shape,
                   const Py_ssize_t *strides, long threads, unsigned long *out) {
    if (crc_of == NULL || itemsize <= 0)
        return 0;
    Py_ssize_t total = itemsize;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0) {
            *out = 0;  /* no bytes */
            return 1;
        }
        total *= shape[i];
    }
    /* the innermost dimensions that step densely make one run */
    Layout l = {base, 0, {0}, {0}, itemsize};
    int d = ndim - 1;
    for (; d >= 0 && (shape[d] == 1 || strides[d] * itemsize == l.run); d--)
        l.run *= shape[d];
    for (int i = 0; i <= d; i++) {
        if (shape[i] == 1)
            continue;
        Py_ssize_t step = strides[i] * itemsize;
        if (l.nd > 0 && l.step[l.nd - 1] == shape[i] * step) {  /* steps over this one exactly: merged */
            l.size[l.nd - 1] *= shape[i];
            l.step[l.nd - 1] = step;
        } else if (l.nd == MAX_DIMS) {
            return 0;
        } else {
            l.size[l.nd] = shape[i];
            l.step[l.nd++] = step;
        }
    }
    if (l.nd > 0 && l.run < MIN_RUN_BYTES)
        return 0;
    if (combine == NULL || threads < 1)
        threads = 1;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads > total / MIN_PER_THREAD)
        threads = total / MIN_PER_THREAD > 0 ? total / MIN_PER_THREAD : 1;
    Part parts[MAX_THREADS];
    Py_ssize_t chunk = (total + threads - 1) / threads;
    for (long t = 0; t < threads; t++) {
        parts[t].layout = &l;
        parts[t].lo = t * chunk < total ? t * chunk : total;
        parts[t].hi = (t + 1) * chunk < total ? (t + 1) * chunk : total;
    }
    PyThreadState *released = total >= GIL_RELEASE_MIN ? PyEval_SaveThread() : NULL;
#ifdef _OPENMP
    if (threads > 1) {
        #pragma omp parallel for num_threads(threads) schedule(static, 1)
        for (long t = 0; t < threads; t++)
            crc_part(&parts[t]);
    } else {
        crc_part(&parts[0]);
    }
#else
    for (long t = 0; t < threads; t++)
        crc_part(&parts[t]);
#endif
    if (released != NULL)
        PyEval_RestoreThread(released);
    unsigned long crc = parts[0].crc;
    for (long t = 1; t < threads; t++)
        crc = combine(crc, parts[t].crc, (int64_t)(parts[t].hi - parts[t].lo)) & 0xFFFFFFFFUL;
    *out = crc;
    return 1;
}

static int read_dims(PyObject *seq, Py_ssize_t *into, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        if (item == NULL)
            return -1;
        into[i] = PyLong_AsSsize_t(item);
        Py_DECREF(item);
        if (into[i] == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

static PyObject *crc32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "crc32(address, itemsize, shape, strides, threads)");
        return NULL;
    }
    uintptr_t address = (uintptr_t)PyLong_AsUnsignedLongLong(args[0]);
    Py_ssize_t itemsize = PyLong_AsSsize_t(args[1]);
    long threads = PyLong_AsLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PySequence_Size(args[2]);
    if (n < 0)
        return NULL;
    if (n > 64 || PySequence_Size(args[3]) != n) {
        PyErr_Format(PyExc_ValueError, "crc32: shape and strides of one length up to 64 (got %zd)", n);
        return NULL;
    }
    Py_ssize_t shape[64], strides[64];
    if (read_dims(args[2], shape, n) < 0 || read_dims(args[3], strides, n) < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (shape[i] < 0 || strides[i] < 0) {
            PyErr_Format(PyExc_ValueError, "crc32: sizes and strides must be >= 0 (got %zd, %zd)", shape[i], strides[i]);
            return NULL;
        }
    }
    unsigned long crc;
    if (!strided((const char *)address, itemsize, (int)n, shape, strides, threads, &crc))
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *configure(PyObject *self, PyObject *args) {
    unsigned long long crc_address, combine_address;
    if (!PyArg_ParseTuple(args, "KK:configure", &crc_address, &combine_address))
        return NULL;
    crc_of = (crc_function)(uintptr_t)crc_address;
    combine = (combine_function)(uintptr_t)combine_address;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"crc32", (PyCFunction)(void (*)(void))crc32, METH_FASTCALL,
     "crc32(address, itemsize, shape, strides, threads) -> zlib's CRC-32 of the elements in index order, or None."},
    {"configure", configure, METH_VARARGS,
     "configure(crc_address, combine_address): the library's CRC function and zlib's crc32_combine64 (0: none)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_crc", NULL, -1, methods};

PyMODINIT_FUNC PyInit__crc(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    static crc_strided function = strided;  /* the capsule holds the address of this pointer */
    PyObject *capsule = PyCapsule_New((void *)&function, CRC_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObject(m, "_strided", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
