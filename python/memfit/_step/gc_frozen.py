"""Python's cyclic garbage collector kept off what was alive before a long
planning call (gc.freeze), for the call's length."""

import contextlib
import functools
import gc

__all__: list = []


# Note [Long calls freeze the objects alive before them]
# A full collection of Python's cyclic GC walks every object in the
# process. advise records dozens of steps, each making thousands of objects
# (hooks, wrappers, timelines), which sets off full collections; on an 8B
# Llama on meta (its copies hold ~450,000 objects) each took 0.25 s, 1.7 s
# of a 27 s advise. Objects alive before the call are not garbage the call
# makes: gc.freeze() moves them out of the collector's reach until
# gc.unfreeze() puts them back, so a full collection walks only the call's
# own. Garbage the user left in reference cycles before the call is
# collected after it instead of during it. A process that froze objects
# itself (gc.get_freeze_count() > 0, a pre-fork server) or runs with the
# collector off is left as it is.
@contextlib.contextmanager
def gc_frozen():
    """See Note [Long calls freeze the objects alive before them]."""
    if not gc.isenabled() or gc.get_freeze_count() > 0:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def with_gc_frozen(fn):
    """fn, run inside gc_frozen()."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with gc_frozen():
            return fn(*args, **kwargs)

    return run
