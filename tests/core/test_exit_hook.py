"""core/exit_hook.py: an ExitHook runs its function at interpreter exit while held, not after drop(), and
lets go of what it held once dropped (real interpreters exiting)."""

import gc
import subprocess
import sys
import weakref

from msprobe.core.exit_hook import ExitHook

PROGRAM = """
import sys
from msprobe.core.exit_hook import ExitHook
held, dropped, again = ExitHook(), ExitHook(), ExitHook()
held.hold(lambda: print("held ran"))
dropped.hold(lambda: print("dropped ran"))
dropped.drop()
again.hold(lambda: print("first"))
again.hold(lambda: print("replaced ran"))  # one registration, the latest function
"""


def test_held_functions_run_at_exit_once_and_dropped_ones_do_not():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split("\n")[:-1]) == ["held ran", "replaced ran"]


class Owner:
    def close(self):
        pass


def test_a_dropped_hook_frees_what_it_held():
    owner, hook = Owner(), ExitHook()
    hook.hold(owner.close)
    ref = weakref.ref(owner)
    del owner
    gc.collect()
    assert ref() is not None  # the bound method keeps it while held
    hook.drop()
    gc.collect()
    assert ref() is None
