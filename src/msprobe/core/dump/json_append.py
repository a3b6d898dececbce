"""A JSON object file that is valid after every append, so a killed process leaves a readable file.

Each append overwrites the closing trailer with `, "key": value` plus the trailer again, in one
`os.pwrite`. A write to a regular file completes even when SIGKILL arrives, so the file on disk is
always the state after some whole append. Used for dump.json (`data` object) and construct.json.

Must not import torch or mindspore.
"""

import json
import math
import os
import threading


def json_float(x):
    """Statistics as JSON numbers; inf/nan become the strings "inf", "-inf", "nan" (valid JSON,
    unlike the bare NaN/Infinity tokens msProbe writes; our reader accepts both)."""
    if x is None or math.isfinite(x):
        return x
    return "nan" if x != x else ("inf" if x > 0 else "-inf")


def _finite(v):
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
        path: file to create (truncated if it exists).
        head: the text up to and including the opening brace of the growing object.
        trailer: the text that closes the file after the growing object.
    """

    def __init__(self, path, head="{", trailer="\n}\n", indent="\n "):
        self.path = path
        self._trailer = trailer.encode()
        self._indent = indent
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        head_b = head.encode()
        os.pwrite(self._fd, head_b + self._trailer, 0)
        self._end = len(head_b)
        self._empty = True

    def append(self, key, value):
        """Append one `"key": value` member. `value` is any JSON-serialisable object; non-finite
        floats in it are written as "inf"/"-inf"/"nan" strings so the file stays strict JSON."""
        try:
            text = json.dumps(value, allow_nan=False)
        except ValueError:  # a bare inf/nan somewhere in value: rare, so only then walk it
            text = json.dumps(_finite(value), allow_nan=False)
        self.append_raw(json.dumps(key), text)

    def append_raw(self, key_json, value_json):
        with self._lock:
            sep = self._indent if self._empty else "," + self._indent
            chunk = f"{sep}{key_json}: {value_json}".encode()
            os.pwrite(self._fd, chunk + self._trailer, self._end)
            self._end += len(chunk)
            self._empty = False

    def close(self):
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
