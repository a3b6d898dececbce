"""A function run at interpreter exit only while there is something for it to do.

An atexit registration holds its function, and a bound method holds its object (a debugger, a
monitor) and all it references, a model included, until the process ends. An ExitHook is registered
while it is needed (`hold`) and unregistered as soon as it is not (`drop`), so that an object the
user let go of is freed. It never unregisters from inside the exit callbacks: doing so crashed
CPython before 3.10.2 / 3.9.10 (bpo-46025).

Must not import torch or mindspore.
"""

import atexit


class ExitHook:
    __slots__ = ("_fn",)

    def __init__(self):
        self._fn = None  # what runs at exit while held; None: not registered

    def hold(self, fn):
        """Run `fn` at interpreter exit (until drop())."""
        if self._fn is None:
            atexit.register(self._run)
        self._fn = fn

    def drop(self):
        if self._fn is not None:
            atexit.unregister(self._run)
            self._fn = None

    def _run(self):
        fn, self._fn = self._fn, None  # running: a drop() from `fn` has nothing to unregister
        if fn is not None:
            fn()
