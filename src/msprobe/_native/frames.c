/* msprobe._frames: the frame walk of core/stack.py's capture_stack in C.
 *
 * walk(frame, keeps, limit) -> tuple of (id(code), instruction offset) from `frame` outward, keeping
 * the frames whose id(code) maps to True in `keeps` and skipping those mapped to False, at most
 * `limit` entries; None as soon as a code object is not in `keeps` (capture_stack then walks in
 * Python, which decides and notes it). The same tuple the Python loop builds, without a bytecode
 * round per frame. Python 3.11+ (PyFrame_GetLasti); elsewhere the module has no `walk`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX >= 0x030B0000
static PyObject *walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyFrame_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "walk(frame, keeps: dict, limit: int)");
        return NULL;
    }
    PyObject *keeps = args[1];
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    if (limit < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "limit must be >= 0");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    PyFrameObject *frame = (PyFrameObject *)args[0];
    Py_INCREF(frame);
    while (frame != NULL && PyList_GET_SIZE(out) < limit) {
        PyCodeObject *code = PyFrame_GetCode(frame);  /* new reference */
        PyObject *cid = PyLong_FromVoidPtr(code);
        Py_DECREF(code);  /* the frame holds it */
        if (cid == NULL) goto fail;
        PyObject *keep = PyDict_GetItemWithError(keeps, cid);  /* borrowed */
        if (keep == NULL) {
            Py_DECREF(cid);
            if (PyErr_Occurred()) goto fail;
            Py_DECREF(frame);
            Py_DECREF(out);
            Py_RETURN_NONE;  /* a code not seen yet: the Python walk decides */
        }
        if (keep == Py_True) {
            PyObject *lasti = PyLong_FromLong(PyFrame_GetLasti(frame));
            PyObject *entry = lasti == NULL ? NULL : PyTuple_Pack(2, cid, lasti);
            Py_XDECREF(lasti);
            if (entry == NULL || PyList_Append(out, entry) < 0) {
                Py_XDECREF(entry);
                Py_DECREF(cid);
                goto fail;
            }
            Py_DECREF(entry);
        }
        Py_DECREF(cid);
        PyFrameObject *back = PyFrame_GetBack(frame);  /* new reference or NULL */
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    PyObject *tuple = PyList_AsTuple(out);
    Py_DECREF(out);
    return tuple;
fail:
    Py_XDECREF(frame);
    Py_DECREF(out);
    return NULL;
}
#endif

static PyMethodDef methods[] = {
#if PY_VERSION_HEX >= 0x030B0000
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL,
     "walk(frame, keeps, limit) -> ((id(code), offset), ...) of the kept frames, or None at an unknown code."},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frames", NULL, -1, methods};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&module); }
