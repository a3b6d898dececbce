"""A JSON object file that is valid after every append, so a killed process leaves a readable file.

Each append (one member, or a batch of them: `append_many`) overwrites the closing trailer with
`, "key": value ...` plus the trailer again, in one `os.pwritev`. A write to a regular file completes
even when SIGKILL arrives, so the file on disk is always the state after some whole append. A short
write (a full disk) is continued; one that fails leaves the file failed: `seal` then ends it after the
last whole append with a trailer that says so or, if even that cannot be written, cuts the trailer
off, so that it never looks whole. Used for dump.json (`data` object) and construct.json.

Must not import torch or mindspore.
"""

import json
import math
import os
import threading

import orjson

from msprobe.core.safe_files import open_new


def json_float(x):
    """Statistics as JSON numbers; inf/nan become the strings "inf", "-inf", "nan" (valid JSON,
    unlike the bare NaN/Infinity tokens msProbe writes; our reader accepts both)."""
    if x is None or math.isfinite(x):
        return x
    return "nan" if x != x else ("inf" if x > 0 else "-inf")


def scalar_record(v):
    """Record of a Python scalar argument (int, float, bool, str); inf/nan as json_float strings, so the
    record holds no non-finite float (what a `finite` file requires)."""
    return {"type": type(v).__name__, "value": json_float(v) if isinstance(v, float) else v}


def encode(value, finite=False):
    """Compact JSON bytes of `value`; non-finite floats become "inf"/"-inf"/"nan" strings.

    orjson is several times faster than json on these small records, but writes NaN and inf as
    null; a record with a null in it is therefore encoded again by json, which tells them apart —
    unless the caller vouches that `value` holds no non-finite float (`finite`): records full of
    None (an API's `bias=None`) would otherwise all take the slow path.
    """
    try:
        text = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):  # ints beyond 64 bits, non-str keys: json copes
        text = None
    if text is not None and (finite or b"null" not in text):
        return text
    out = json.dumps(_finite(value), allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return out.encode()


def pwrite_all(fd, data, offset):
    """`os.pwrite` until all of `data` is written (a full disk may take part of it, then raise)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(28, "No space left on device (short write)")
        view, offset = view[n:], offset + n


def pwritev_all(fd, buffers, offset):
    """`buffers` (a few bytes objects) written at `offset` as one, in one `os.pwritev` unless the disk
    takes only part of it: no copy of a large batch just to add its separator and trailer."""
    n = os.pwritev(fd, buffers, offset)
    if n < sum(len(b) for b in buffers):  # a short write (a full disk): the rest as one buffer
        pwrite_all(fd, b"".join(buffers)[n:], offset + n)


def _finite(v):
    """`v` with non-finite floats as json_float strings."""
    if isinstance(v, float):
        return json_float(v)
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


class JsonAppendFile:
    """An always-valid JSON file whose innermost object grows by appends.

    Args:
        path: file to create (0640, never through a symbolic link; truncated if it exists).
        head: the text up to and including the opening brace of the growing object.
        trailer: the text that closes the file after the growing object.
    """

    def __init__(self, path, head="{", trailer="\n}\n", indent="\n ", finite=False, fd=None):
        self.path = path
        self.finite = finite  # values hold no non-finite float: see encode()
        self._trailer = trailer.encode()
        self._sep_first = indent.encode()
        self._sep = b"," + self._sep_first
        self._lock = threading.Lock()
        self.failed = False  # a write failed: nothing more is appended (see seal)
        self._empty = True
        if fd is not None:  # made by the caller, `first_bytes(head, trailer)` written at its start
            self._fd, self._end = fd, len(head.encode())
            return
        self._end = 0
        self._fd = open_new(path)
        try:
            self._write_end(head.encode())
        except OSError:
            self.close()
            raise

    @staticmethod
    def first_bytes(head="{", trailer="\n}\n"):
        """What a new file holds before its first append (for a caller that creates it: `fd`)."""
        return (head + trailer).encode()

    def _write_end(self, chunk, body=b""):
        """Write `chunk`, `body` and the trailer at the end of the object (called holding the lock)."""
        if self.failed or self._fd is None:
            return
        try:
            pwritev_all(self._fd, (chunk, body, self._trailer), self._end)
        except OSError:
            self.failed = True
            raise
        self._end += len(chunk) + len(body)

    def seal(self, trailer):
        """After a failed write: end the file after the last whole append with `trailer` (bytes: e.g. one
        that marks it incomplete); if that cannot be written either, without a trailer (invalid JSON:
        never a file that looks whole). Nothing more is appended."""
        with self._lock:
            self.failed = True
            if self._fd is None:
                return
            try:
                pwrite_all(self._fd, trailer, self._end)
                os.ftruncate(self._fd, self._end + len(trailer))
            except OSError:
                try:
                    os.ftruncate(self._fd, self._end)
                except OSError:
                    pass

    def append(self, key, value):
        """Append one `"key": value` member. `value` is any JSON-serialisable object; non-finite
        floats in it are written as "inf"/"-inf"/"nan" strings so the file stays strict JSON
        (unless the file was opened `finite`: then the caller has made them strings already)."""
        self.append_many(((key, value),))

    def _value_json(self, value):
        if self.finite:  # the hot path (every dump record): orjson straight, no null check
            try:
                return orjson.dumps(value)
            except (TypeError, orjson.JSONEncodeError):
                return encode(value, True)
        return encode(value)

    def append_many(self, items):
        """Append `(key, value)` members (a sequence) in one write (all or, if the process dies, none of them)."""
        if self.finite:  # the hot path (every dump record): orjson straight, no call per record
            dumps = orjson.dumps
            try:
                parts = [dumps(key) + b": " + dumps(value) for key, value in items]
            except (TypeError, orjson.JSONEncodeError):
                parts = [dumps(key) + b": " + self._value_json(value) for key, value in items]
        else:
            parts = [orjson.dumps(key) + b": " + self._value_json(value) for key, value in items]
        if not parts:
            return
        with self._lock:
            self._write_end(self._sep_first if self._empty else self._sep, self._sep.join(parts))
            self._empty = False

    def append_raw(self, key_json, value_json):
        """Append a member from its key and value already encoded as JSON (bytes or str)."""
        if isinstance(key_json, str):
            key_json = key_json.encode()
        if isinstance(value_json, str):
            value_json = value_json.encode()
        with self._lock:
            sep = self._sep_first if self._empty else self._sep
            self._write_end(b"".join((sep, key_json, b": ", value_json)))
            self._empty = False

    def close(self):
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
