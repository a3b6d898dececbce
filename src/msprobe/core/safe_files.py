"""Files and directories created as msProbe creates them: dirs 0750 and files 0640 whatever the
umask, never through a symbolic link (a link planted where msprobe creates a file or directory
would make it write wherever the link points).

Every dump and analysis output goes through `make_dirs`/`open_new`/`open_text`; `check_output_dir`
says in one line why a directory given by the user cannot take output. Must not import torch or
mindspore.
"""

import errno
import os
import stat

from msprobe.core.errors import ConfigError, MsprobeError

DIR_MODE = 0o750
FILE_MODE = 0o640
_NEW = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class UnsafePathError(MsprobeError):
    """A path msprobe was to write is a symbolic link, not a directory, or not writable."""


def _refuse_link(path, st=None):
    st = os.lstat(path) if st is None else st
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{path}: is a symbolic link; msprobe does not write through links "
                              "(give the directory it points to)")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path}: exists and is not a directory")


def make_dir(path, exist_ok=True):
    """Create directory `path` (its parent exists) 0750; returns True if this call made it. An existing
    `path` must be a real directory (not a link to one); with `exist_ok` False it raises
    FileExistsError."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        if not exist_ok:
            raise
        _refuse_link(path)
        return False
    os.chmod(path, DIR_MODE)  # mkdir's mode is masked by the umask
    return True


def make_dirs(path):
    """`path` and its missing parents, each made 0750; the existing part must not end in a link.
    Returns the directories made, innermost first."""
    missing, d = [], os.path.abspath(path)
    while True:
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            missing.append(d)
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
            continue
        _refuse_link(d, st)
        break
    made = []
    for d in reversed(missing):
        if make_dir(d):
            made.insert(0, d)
    return made


def open_new(path, truncate=True, exclusive=False):
    """A file descriptor of `path` for writing, created 0640 (an existing one, too, is set 0640);
    a symbolic link at `path` is refused. `exclusive`: the file must not exist yet."""
    flags = _NEW | (os.O_EXCL if exclusive else 0) | (os.O_TRUNC if truncate else 0)
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError(f"{path}: is a symbolic link; msprobe does not write through links") from None
        raise
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def open_text(path, mode="w", encoding="utf-8", newline=None):
    """`open(path, mode)` for writing ("w", "a", "wb", "ab") made with `open_new`."""
    append = "a" in mode
    fd = open_new(path, truncate=not append)
    if append:
        os.lseek(fd, 0, os.SEEK_END)
    if "b" in mode:
        return os.fdopen(fd, mode)
    return os.fdopen(fd, mode, encoding=encoding, newline=newline)


def check_output_dir(path, field):
    """One-line MsprobeError unless `path` can take output: an existing real, writable directory, or
    a path that does not exist under a writable directory. Writes nothing."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ConfigError(field, path, "a non-empty path string")
    path = os.fspath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise ConfigError(field, path, f"a directory msprobe can write ({e.strerror})") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise ConfigError(field, path, "a directory, not a symbolic link (give the directory it points to)")
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError(field, path, "a directory (this is a file)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(field, path, "a directory msprobe can write (this one is not writable)")
        return
    d = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(d):
        d = os.path.dirname(d)
    if not os.path.isdir(d):
        raise ConfigError(field, path, f"a path under a directory ({d} is a file)")
    if not os.access(d, os.W_OK | os.X_OK):
        raise ConfigError(field, path, f"a directory msprobe can create ({d} is not writable)")
