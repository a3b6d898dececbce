"""What only the cyclic garbage collector would free: objects left in reference cycles.

Tensors caught in a cycle live until a collection runs, and allocations made by torch or MindSpore never
trigger one (msprobe also pauses the collector during a dumped step), so memory grows with the work
instead of staying at one step's or one API's size. Tests use this to show that msprobe frees as it goes.
"""

import gc


def cyclic_garbage_of(work, *args):
    """Run `work(*args)` with the collector off; the objects a collection then finds: [(type name, obj)].
    What was alive before, garbage included (e.g. FakeTensors that torch's C++ side let go of only later,
    after another test compiled a graph in this process), is frozen through the work (`gc.freeze`): not
    the work's garbage, and the collection walks only what the work made, not the whole process."""
    was_enabled = gc.isenabled()
    gc.disable()
    gc.freeze()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        work(*args)
        gc.collect()
        return [(type(o).__name__, o) for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.unfreeze()
        if was_enabled:
            gc.enable()
