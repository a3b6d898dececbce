"""The checksum in a record's "md5" field: CRC-32 (zlib's) of the tensor's bytes, 8 hex digits, as msProbe
writes it. The bytes are the tensor's elements in index order, in its own dtype (the memory of a contiguous
copy). On the host: ISA-L's CRC-32 (zlib's numbers, several times faster; zlib where it has no wheel),
straight on the tensor's memory; through msprobe._crc a view is read as its dense runs in index order,
without that copy, and a large tensor in one stretch a thread, the parts joined as below.

On a device the CRC is computed in parallel, by linearity. Without its initial value and final xor (the
"raw" CRC, register starting at 0) CRC-32 is linear over GF(2):

    raw(A || B) = shift(raw(A), len(B)) ^ raw(B),   shift(c, n) = c * x^(8n) mod P   (zlib's crc32_combine)
    crc32(M) = raw(M) ^ shift(0xFFFFFFFF, len(M)) ^ 0xFFFFFFFF                          (`finish_raw`)

So a message is cut into rows of ROW bytes counted from its end (the first row zero-padded in front: leading
zeros leave a raw CRC unchanged); a row's raw CRC is the xor of one table lookup per byte (`row_tables`:
table[c][b] = raw CRC of byte b at column c of an otherwise zero row); a row with q rows after it is
shifted by ROW*q bytes, one bit of q at a time (`shift_tables`: level k multiplies by x^(8*ROW*2^k), as
four byte-indexed tables) or for small q in one lookup (`position_tables`); the shifted rows xored
together are the message's raw CRC. Every row is
independent: a GPU grid, torch ops on a device and the CPU give the same value, equal to zlib's.
Must not import torch or mindspore.
"""

import ctypes
import functools
import os

import numpy as np

try:
    from isal import isal_zlib as _isal
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # no isal wheel for this platform: zlib gives the same numbers, slower
    _isal = None
    from zlib import crc32 as _crc32

CRC32 = "CRC-32"
# what a 16-digit "md5" field holds: a dump written by msprobe before it wrote CRC-32
OLDER64 = "64-bit (older msprobe)"

POLY = 0xEDB88320  # CRC-32's polynomial, bit-reflected (zlib)
_M32 = 0xFFFFFFFF
# bytes a row of the parallel CRC; the device kernels' tables are ROW x 256 entries
ROW = 64
# shift levels the tables hold: rows of up to ROW * 2^SHIFT_LEVELS bytes before the end (2^46 bytes)
SHIFT_LEVELS = 40


def crc32(data, value=0):
    """zlib's CRC-32 of a bytes-like object (contiguous: bytes, memoryview, numpy array), as an int."""
    return _crc32(data, value) & _M32


def crc32_hex(data):
    """CRC-32 of a bytes-like object as 8 hex digits (the "md5" field)."""
    return f"{_crc32(data) & _M32:08x}"


# a read-only memoryview of raw memory: the CRC reads a tensor's bytes with no array object built
_memory = ctypes.pythonapi.PyMemoryView_FromMemory
_memory.restype, _memory.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_PYBUF_READ = 0x100


def _function(path, name):
    """The address of C function `name` in the shared library at `path`, or 0."""
    try:
        return ctypes.cast(getattr(ctypes.CDLL(path), name), ctypes.c_void_p).value or 0
    except (OSError, AttributeError):
        return 0


def _native_crc():
    """msprobe._crc (C: tensors read in index order in place, large ones on several threads) set up with
    ISA-L's CRC function (else zlib's) and zlib's crc32_combine64; None where it is not built, where
    neither library is found, or with MSPROBE_NATIVE_CRC=0."""
    if os.environ.get("MSPROBE_NATIVE_CRC", "1") == "0":
        return None
    try:
        from msprobe import _crc
    except ImportError:
        return None
    function = _function(_isal.__file__, "crc32_gzip_refl") if _isal is not None else 0
    function = function or _function("libz.so.1", "crc32_z")
    if not function:
        return None
    _crc.configure(function, _function("libz.so.1", "crc32_combine64"))
    return _crc


_native = _native_crc()
# the C callers' switch (msprobe._record reads the CRC through msprobe._crc's capsule when this is set)
NATIVE = _native is not None


def crc32_hex_strided(address, itemsize, shape, strides, threads=1):
    """8 hex digits of the CRC-32 of the elements at `address` (`itemsize` bytes each, `shape` and
    `strides` in elements: memory the caller keeps alive) in index order, read in place on up to
    `threads` threads; None where msprobe._crc does not read it (not built, or a view of short runs:
    copy it contiguous)."""
    got = _native.crc32(address, itemsize, shape, strides, threads) if _native is not None else None
    return None if got is None else f"{got:08x}"


def crc32_hex_at(address, nbytes, threads=1):
    """`crc32_hex` of the `nbytes` bytes at `address` (dense memory the caller keeps alive)."""
    if _native is not None:
        return f"{_native.crc32(address, 1, (nbytes,), (1,), threads):08x}"
    return crc32_hex(_memory(address, nbytes, _PYBUF_READ) if nbytes else b"")


def _byte_table():
    """zlib's table: raw CRC of each single byte."""
    c = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        c = np.where(c & 1, (c >> np.uint32(1)) ^ np.uint32(POLY), c >> np.uint32(1)).astype(np.uint32)
    return c


_TABLE = _byte_table()


def _multmodp(a, b):
    """a * b mod P of two bit-reflected 32-bit polynomials (zlib's multmodp); `b` may be a numpy array."""
    p = b ^ b  # zero of b's type
    m = 1 << 31
    while a & (m | (m - 1)):
        if a & m:
            p ^= b
            a &= ~m
        m >>= 1
        b = (b >> 1) ^ (POLY * (b & 1)) if isinstance(b, int) else (b >> np.uint32(1)) ^ (
            np.uint32(POLY) * (b & np.uint32(1)))
    return p


@functools.lru_cache(maxsize=4096)
def _x8n(nbytes):
    """x^(8 * nbytes) mod P: what shifting a CRC register over `nbytes` zero bytes multiplies it by."""
    p, sq = 1 << 31, 1 << 23  # x^0; x^8 (one byte), bit-reflected
    while nbytes:
        if nbytes & 1:
            p = _multmodp(sq, p)
        nbytes >>= 1
        sq = _multmodp(sq, sq)
    return p


def shift(crc, nbytes):
    """The raw CRC `crc` carried over `nbytes` zero bytes (crc32_combine's operator)."""
    return _multmodp(_x8n(nbytes), crc & _M32)


def finish_raw(raw, nbytes):
    """8 hex digits of the CRC-32 of `nbytes` bytes whose raw CRC (register from 0, no final xor) is `raw`."""
    return f"{(raw ^ _final_xor(nbytes)) & _M32:08x}"


@functools.lru_cache(maxsize=4096)
def _final_xor(nbytes):
    # a dump meets few tensor sizes: the shift (32 polynomial steps in Python) once per size
    return shift(_M32, nbytes) ^ _M32


def combine(crc1, crc2, len2):
    """CRC-32 of A || B from crc32(A), crc32(B) and len(B) (zlib's crc32_combine)."""
    return (shift(crc1, len2) ^ crc2) & _M32


@functools.lru_cache(maxsize=4)
def row_tables(row=ROW):
    """(row, 256) uint32: [c][b] is the raw CRC of a `row`-byte row holding b at column c, zeros elsewhere."""
    out = np.empty((row, 256), dtype=np.uint32)
    out[row - 1] = _TABLE
    for c in range(row - 2, -1, -1):  # one more zero byte after it: one table step
        prev = out[c + 1]
        out[c] = (prev >> np.uint32(8)) ^ _TABLE[prev & np.uint32(0xFF)]
    return out


@functools.lru_cache(maxsize=4)
def shift_tables(row=ROW, levels=SHIFT_LEVELS):
    """(levels, 4, 256) uint32: level k shifts a raw CRC by row * 2^k bytes as the xor of
    [k][i][byte i of the CRC] over its four bytes."""
    out = np.empty((levels, 4, 256), dtype=np.uint32)
    b = np.arange(256, dtype=np.uint32)
    for k in range(levels):
        op = _x8n(row << k)
        for i in range(4):
            out[k, i] = _multmodp(op, b << np.uint32(8 * i))
    return out


@functools.lru_cache(maxsize=4)
def position_tables(row=ROW, count=64):
    """(count, 4, 256) uint32: [q][i][b] shifts a raw CRC by q rows of `row` bytes, as `shift_tables` does
    by a power of two: one lookup for a row fewer than `count` rows from the end."""
    out = np.empty((count, 4, 256), dtype=np.uint32)
    b = np.arange(256, dtype=np.uint32)
    for q in range(count):
        op = _x8n(row * q)
        for i in range(4):
            out[q, i] = _multmodp(op, b << np.uint32(8 * i))
    return out


def checksum_kind(value):
    """Which checksum a record's "md5" field holds: CRC32 (8 hex digits, msProbe's and ours), OLDER64
    (16, dumps of msprobe before it wrote CRC-32), or None for anything else."""
    if not isinstance(value, str):
        return None
    return {8: CRC32, 16: OLDER64}.get(len(value))
