"""Bounds on every file msprobe reads: dump.json, stack.json, construct.json, api_sources.json,
compare.json, mapping YAMLs, tensor files and monitor files may come from another machine or team.

A file must be a regular file (a FIFO, socket or device is refused before it is read: opening a FIFO
would wait for a writer forever) no bigger than its limit; JSON nests at most `MAX_JSON_DEPTH` deep
and its integers have at most `max_int_digits()` digits. Each refusal is one DumpFormatError naming the
file, what was found and the environment variable that raises the limit. Must not import torch or
mindspore.

Limits (environment variables, read at each use):
- MSPROBE_MAX_JSON_BYTES: the largest JSON or YAML file (default 8 GiB). The biggest dump.json files
  of real runs are a few GB; parsing takes about 10x the file in memory, so 8 GiB already needs a large
  host, and a bigger file is more likely a mistake or an attack than a dump.
- MSPROBE_MAX_TENSOR_BYTES: the largest tensor file (default 64 GiB, beyond any single device tensor).
- MSPROBE_MAX_INT_DIGITS: the longest JSON integer (default 100 digits; a dump's integers are sizes,
  counters and Python int arguments, 64-bit in practice, while million-digit ones cost quadratic time).
"""

import json
import os
import stat

from msprobe.core.errors import DumpFormatError, MsprobeError

GiB = 1 << 30
DEFAULTS = {"MSPROBE_MAX_JSON_BYTES": 8 * GiB, "MSPROBE_MAX_TENSOR_BYTES": 64 * GiB, "MSPROBE_MAX_INT_DIGITS": 100}
MAX_JSON_DEPTH = 1024  # orjson's own bound; the fallback parser is held to it too (dumps nest < 20 deep)
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symlink"}


def limit(name):
    """The limit environment variable `name` sets (a positive integer), or its default."""
    text = os.environ.get(name)
    if text is None or text == "":
        return DEFAULTS[name]
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise MsprobeError(f"environment variable {name}={text!r}: expected a positive integer "
                           f"(default {DEFAULTS[name]})")
    return value


def max_int_digits():
    return limit("MSPROBE_MAX_INT_DIGITS")


def open_regular(path, limit_name="MSPROBE_MAX_JSON_BYTES"):
    """The file at `path` opened for binary reading, once it is known to be a regular file within the
    size limit `limit_name` (checked on the open descriptor: no window for a swap).

    Raises:
        DumpFormatError: missing, not a regular file, unreadable or too big.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise DumpFormatError(f"{path}: file not found") from None
    except OSError as e:
        raise DumpFormatError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
            raise DumpFormatError(f"{path}: is {kind}; expected a regular file")
        most = limit(limit_name)
        if info.st_size > most:
            raise DumpFormatError(f"{path}: {info.st_size:,} bytes, over the limit of {most:,} "
                                  f"(set {limit_name} to read it)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_regular(path, limit_name="MSPROBE_MAX_TENSOR_BYTES"):
    """Raises DumpFormatError unless `path` is a regular file within the limit (for readers that open
    the path themselves, such as numpy's and zipfile's)."""
    open_regular(path, limit_name).close()


def read_bytes(path, limit_name="MSPROBE_MAX_JSON_BYTES"):
    with open_regular(path, limit_name) as f:
        return f.read()


def load_json(path):
    """The parsed JSON file, bounded as this module says; orjson first (dump.json files reach hundreds
    of MB), the standard parser for what orjson refuses but Python's json accepts (msProbe's bare
    NaN/Infinity tokens, integers beyond 64 bits).

    Raises:
        DumpFormatError: not readable, not a regular file, too big, too deep, an integer too long, or
            not valid JSON; one line naming the file.
    """
    import orjson
    raw = read_bytes(path)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        if "recursion limit" in str(e):
            raise _too_deep(path) from None
    digits = max_int_digits()

    def bounded_int(text):
        if len(text.lstrip("-")) > digits:
            raise DumpFormatError(f"{path}: an integer of {len(text.lstrip('-')):,} digits, over the limit of "
                                  f"{digits} (set MSPROBE_MAX_INT_DIGITS to read it)")
        return int(text)
    try:
        return json.loads(raw.decode("utf-8"), parse_int=bounded_int)
    except RecursionError:
        raise _too_deep(path) from None
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:  # bounded_int's error passes through
        detail = " ".join(str(e).split())[:200]
        raise DumpFormatError(f"{path}: not valid JSON ({detail}); the file may be truncated or corrupt") from None


def _too_deep(path):
    return DumpFormatError(f"{path}: JSON nested deeper than {MAX_JSON_DEPTH} levels; not a dump file")
