/* The statistics kernel of msprobe._moments as other extensions call it: through the capsule
   `msprobe._moments._kernel` (one copy of the kernel, linked once). */
#ifndef MSPROBE_MOMENTS_H
#define MSPROBE_MOMENTS_H
#include <Python.h>

#define MOMENTS_CAPSULE "msprobe._moments._kernel"

/* (max, min, mean, norm) of `rows` runs of `count` elements of `kind` (0 float32, 1 float64,
   2 bfloat16, from MOMENTS_FIRST_INT on integers: 3 int64, 4 int32) `row_stride` elements apart, into
   `out`; 0 when not finite or an integer is beyond +-2^53 (the framework reduces it). An integer
   tensor's max and min are whole numbers: its record writes them as ints. The GIL is held by the
   caller (released inside on large buffers). */
#define MOMENTS_FIRST_INT 3
typedef int (*moments_kernel)(const void *address, Py_ssize_t count, int kind, long threads, Py_ssize_t rows,
                              Py_ssize_t row_stride, double out[4]);

#endif
