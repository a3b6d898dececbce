/* msprobe._step_files: a step's rank directory and its files made in one call that holds no GIL.
 *
 * make(step_dir, rank_dir, subdirs, files, dir_mode, file_mode) -> (made_step_dir, [fd of each file])
 *   step_dir: made if missing; if there, it must be a real directory (not a link).
 *   rank_dir: made exclusively (it must not exist).
 *   subdirs:  directories made inside it (dump_tensor_data/).
 *   files:    (path, first bytes) each created exclusively, never through a link, and written whole.
 *   Directories get dir_mode and files file_mode whatever the umask (a chmod after each is made).
 * Any failure undoes what the call made (files removed, directories removed) and raises OSError naming
 * the path: the caller then takes core/safe_files.py's way, which says why in its own words.
 *
 * Why: the writer pool opens a step's files while the training thread runs the step's first calls. Each
 * os.mkdir/os.open/os.chmod there let go of the GIL and took it back: a dozen hand-overs with the
 * training thread, which each cost it a wake-up and a wait. Here the pool thread takes the GIL once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_ITEMS 8

#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif

typedef struct {
    PyObject *path;  /* bytes (PyUnicode_FSConverter) */
    const char *data;
    Py_ssize_t len;
    int fd;
} NewFile;

/* the syscalls, without the GIL: 0, or an errno with *where the path it concerns */
static int make_all(const char *step, const char *rank, PyObject **subdirs, Py_ssize_t nsub, NewFile *files,
                    Py_ssize_t nfiles, int dir_mode, int file_mode, int *made_step, const char **where) {
    int made_rank = 0, err = 0;
    Py_ssize_t subs_made = 0, opened = 0;
    *made_step = 0;
    if (mkdir(step, (mode_t)dir_mode) == 0) {
        *made_step = 1;
        if (chmod(step, (mode_t)dir_mode) != 0)
            err = errno, *where = step;
    } else if (errno == EEXIST) {
        struct stat st;
        if (lstat(step, &st) != 0)
            err = errno, *where = step;
        else if (!S_ISDIR(st.st_mode))  /* a link or a file: safe_files words it */
            err = ENOTDIR, *where = step;
    } else {
        err = errno, *where = step;
    }
    if (!err) {
        if (mkdir(rank, (mode_t)dir_mode) == 0) {
            made_rank = 1;
            if (chmod(rank, (mode_t)dir_mode) != 0)
                err = errno, *where = rank;
        } else {
            err = errno, *where = rank;
        }
    }
    for (Py_ssize_t i = 0; !err && i < nsub; i++) {
        const char *d = PyBytes_AS_STRING(subdirs[i]);
        if (mkdir(d, (mode_t)dir_mode) != 0) {
            err = errno, *where = d;
            break;
        }
        subs_made = i + 1;
        if (chmod(d, (mode_t)dir_mode) != 0)
            err = errno, *where = d;
    }
    for (Py_ssize_t i = 0; !err && i < nfiles; i++) {
        const char *p = PyBytes_AS_STRING(files[i].path);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode_t)file_mode);
        if (fd < 0) {
            err = errno, *where = p;
            break;
        }
        files[i].fd = fd;
        opened = i + 1;
        if (fchmod(fd, (mode_t)file_mode) != 0) {
            err = errno, *where = p;
            break;
        }
        for (Py_ssize_t off = 0; off < files[i].len;) {
            ssize_t n = pwrite(fd, files[i].data + off, (size_t)(files[i].len - off), (off_t)off);
            if (n <= 0) {
                err = n < 0 ? errno : ENOSPC, *where = p;
                break;
            }
            off += n;
        }
    }
    if (err) {  /* nothing half made is left behind */
        for (Py_ssize_t i = 0; i < opened; i++) {
            close(files[i].fd);
            files[i].fd = -1;
            unlink(PyBytes_AS_STRING(files[i].path));
        }
        for (Py_ssize_t i = subs_made; i > 0; i--)
            rmdir(PyBytes_AS_STRING(subdirs[i - 1]));
        if (made_rank)
            rmdir(rank);
        if (*made_step)
            rmdir(step);
        *made_step = 0;
    }
    return err;
}

static PyObject *make(PyObject *self, PyObject *args) {
    PyObject *step = NULL, *rank = NULL, *subs_arg, *files_arg, *result = NULL;
    int dir_mode, file_mode;
    PyObject *subdirs[MAX_ITEMS];
    NewFile files[MAX_ITEMS];
    Py_ssize_t nsub = 0, nfiles = 0;
    if (!PyArg_ParseTuple(args, "O&O&O!O!ii:make", PyUnicode_FSConverter, &step, PyUnicode_FSConverter, &rank,
                          &PyList_Type, &subs_arg, &PyList_Type, &files_arg, &dir_mode, &file_mode))
        goto done;
    if (PyList_GET_SIZE(subs_arg) > MAX_ITEMS || PyList_GET_SIZE(files_arg) > MAX_ITEMS) {
        PyErr_Format(PyExc_ValueError, "make: at most %d subdirs and %d files", MAX_ITEMS, MAX_ITEMS);
        goto done;
    }
    for (; nsub < PyList_GET_SIZE(subs_arg); nsub++)
        if (!PyUnicode_FSConverter(PyList_GET_ITEM(subs_arg, nsub), &subdirs[nsub]))
            goto done;
    for (; nfiles < PyList_GET_SIZE(files_arg); nfiles++) {
        PyObject *item = PyList_GET_ITEM(files_arg, nfiles), *path = NULL;
        files[nfiles].fd = -1;
        if (!PyArg_ParseTuple(item, "O&y#:make", PyUnicode_FSConverter, &path, &files[nfiles].data,
                              &files[nfiles].len))
            goto done;
        files[nfiles].path = path;
    }
    const char *where = NULL;
    int made_step = 0, err;
    Py_BEGIN_ALLOW_THREADS
    err = make_all(PyBytes_AS_STRING(step), PyBytes_AS_STRING(rank), subdirs, nsub, files, nfiles, dir_mode,
                   file_mode, &made_step, &where);
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, where);
        goto done;
    }
    PyObject *fds = PyList_New(nfiles);
    if (fds == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < nfiles; i++) {
        PyObject *fd = PyLong_FromLong(files[i].fd);
        if (fd == NULL) {
            Py_DECREF(fds);
            goto done;
        }
        PyList_SET_ITEM(fds, i, fd);
    }
    result = Py_BuildValue("(NN)", PyBool_FromLong(made_step), fds);
done:
    Py_XDECREF(step);
    Py_XDECREF(rank);
    for (Py_ssize_t i = 0; i < nsub; i++)
        Py_DECREF(subdirs[i]);
    for (Py_ssize_t i = 0; i < nfiles; i++)
        Py_DECREF(files[i].path);
    return result;
}

static PyMethodDef methods[] = {
    {"make", make, METH_VARARGS,
     "make(step_dir, rank_dir, subdirs, files, dir_mode, file_mode) -> (made_step_dir, fds): see the source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_step_files", NULL, -1, methods};

PyMODINIT_FUNC PyInit__step_files(void) { return PyModule_Create(&module); }
