"""The checksum in a record's "md5" field: wordsum64, 16 hex digits, computable where a tensor lives.

msProbe writes a CRC-32 (8 hex digits) of the bytes, which a GPU cannot compute without copying the
tensor to the host. wordsum64 is made of 32-bit integer operations that any device runs in one pass:

    the bytes as little-endian 32-bit words w_0 .. w_{m-1} (the last one zero-padded);
    a_i = mix(w_i XOR (i * K0 mod 2^32));         mix: xor-shift-multiply, a bijection on 32 bits
    S1 = sum of a_i mod 2^32,  S2 = sum of mix2(a_i) mod 2^32;
    value = splitmix64-finish(((S1 << 32) | S2) XOR nbytes), printed as 16 hex digits.

Each word is keyed by its position, so moved bytes change the value; the sums do not depend on the
order they are added in, so a CPU thread split, a GPU grid and numpy give the same value. It is a
checksum for telling bytes apart, not a cryptographic hash. A CRC-32 (8 digits) and a wordsum64
(16 digits) are told apart by their length (`checksum_kind`).

The sums come from the C extension on the host (`msprobe._moments.wordsum`), from the adapters'
device kernels on an accelerator, or from `wordsum_numpy` (the reference, and the fallback).
grad_probe's MD5 column keeps msProbe's CRC-32 (`crc32_hex`, ISA-L; zlib where it has no wheel): it is
computed on the host from a gradient already copied there.
Must not import torch or mindspore.
"""

import numpy as np

try:
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # no isal wheel for this platform: zlib gives the same numbers, slower
    from zlib import crc32 as _crc32

from msprobe.core.dump import moments as native

K0, K1, K2, K3 = 0x61C88647, 0x7FEB352D, 0x2C1B3C6D, 0x1B873593
_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
# words per numpy chunk: bounds the temporaries of the fallback
_CHUNK = 1 << 20

WORDSUM64 = "wordsum64"
CRC32 = "CRC-32"


def finish(s1, s2, nbytes):
    """The 16 hex digits from the two 32-bit sums and the byte count."""
    h = (((s1 & _M32) << 32) | (s2 & _M32)) ^ (nbytes & _M64)
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & _M64
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & _M64
    h ^= h >> 31
    return f"{h:016x}"


def _mix_np(a):
    a ^= a >> np.uint32(16)
    a *= np.uint32(K1)
    a ^= a >> np.uint32(15)
    a *= np.uint32(K2)
    a ^= a >> np.uint32(16)
    return a


def wordsum_numpy(data):
    """(S1, S2) of a bytes-like object, in numpy (uint32 arithmetic wraps mod 2^32 by definition)."""
    raw = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    n = raw.size
    if n % 4:
        raw = np.concatenate([raw, np.zeros(4 - n % 4, dtype=np.uint8)])
    words = raw.view("<u4")
    s1 = s2 = 0
    with np.errstate(over="ignore"):
        for start in range(0, words.size, _CHUNK):
            w = words[start:start + _CHUNK].astype(np.uint32)
            idx = np.arange(start, start + w.size, dtype=np.uint64).astype(np.uint32)
            a = _mix_np(w ^ (idx * np.uint32(K0)))
            b = a * np.uint32(K3)
            b ^= b >> np.uint32(13)
            s1 += int(a.sum(dtype=np.uint64))
            s2 += int(b.sum(dtype=np.uint64))
    return s1 & _M32, s2 & _M32


def wordsum(address, nbytes, threads=1):
    """(S1, S2) of `nbytes` bytes at `address` (memory the caller keeps alive) through the C extension,
    or None when it is not built."""
    if native.wordsum is None:
        return None
    return native.wordsum(address, nbytes, threads)


def checksum_hex(data, threads=1):
    """wordsum64 of a bytes-like object (bytes, memoryview, a contiguous numpy array) as 16 hex digits."""
    view = memoryview(data).cast("B")
    n = view.nbytes
    if n and native.wordsum is not None:
        arr = np.frombuffer(view, dtype=np.uint8)
        sums = native.wordsum(arr.__array_interface__["data"][0], n, threads)
    else:
        sums = wordsum_numpy(view) if n else (0, 0)
    return finish(sums[0], sums[1], n)


def crc32_hex(data):
    """CRC-32 of a bytes-like object as 8 hex digits (msProbe's checksum)."""
    return f"{_crc32(data) & 0xFFFFFFFF:08x}"


def checksum_kind(value):
    """Which checksum a record's "md5" field holds: CRC32 (msProbe, 8 hex digits), WORDSUM64 (16), or
    None for anything else."""
    if not isinstance(value, str):
        return None
    return {8: CRC32, 16: WORDSUM64}.get(len(value))
