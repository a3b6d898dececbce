/* The CRC-32 of msprobe._crc as other extensions call it: through the capsule `msprobe._crc._strided`. */
#ifndef MSPROBE_CRC_H
#define MSPROBE_CRC_H
#include <Python.h>

#define CRC_CAPSULE "msprobe._crc._strided"

/* zlib's CRC-32 of the elements at `base` (`itemsize` bytes each; `ndim` dimensions of `shape` with
   `strides` in elements) in index order, into `*out`, on up to `threads` threads. 1 when done, 0 when
   not done here (no CRC library configured, more dimensions than it walks, or dense runs too short to be
   worth a call each): the caller copies the tensor contiguous and reads it otherwise. The GIL is held by
   the caller (released inside on large reads). */
typedef int (*crc_strided)(const char *base, Py_ssize_t itemsize, int ndim, const Py_ssize_t *shape,
                           const Py_ssize_t *strides, long threads, unsigned long *out);

#endif
