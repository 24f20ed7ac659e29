"""What the user's own functions keep, put back after a rehearsal ran them:
the step function's and loss function's, a wrapper set on an optimizer's
step, the optimizer's step pre-hooks. See Note [What the user's functions
keep]."""

from __future__ import annotations

import copy
import dis
import functools

import torch
import torch.nn.modules.module as torch_module  # its global hooks
import torch.optim.optimizer as torch_optimizer  # its global hooks

from .user_state import CONTAINERS, container_contents, put_contents_back
from .user_step import UserStep

__all__: list = []

# Note [What the user's functions keep]
# A rehearsal runs the user's code a dozen times in one find_batch_size (18
# in a search from an example of 8): the step function (step=) or loss_fn,
# a wrapper the user set on the optimizer's step (opt.step =
# counted(opt.step), as a counter or a logger), the optimizer's step
# pre-hooks (which run: they shape the gradients the step updates from) and
# the hooks on the model's modules. What these keep outside the model and
# optimizer moved each time: a nonlocal step count ended at 18, a `global
# n` at 18, a list of logged losses held 18 entries, a forward hook's list
# of each output's mean 18 of the rehearsals' tensors (meta ones on meta).
# So the state these functions reach is saved before the rehearsal and put
# back after it: each closure cell's object (a nonlocal rebound), the
# globals the code assigns (`global n`), the function's own attributes
# (wrapper.calls += 1), the items of the lists, dicts, sets and deques
# among those and among the globals it reads, and for a bound method or a
# callable object of the user's, its public attributes, as for a forward's
# counters (Note [A forward's counters], user_state.py). The functions they
# call are followed a few levels (a wrapper's wrapped step, a helper the
# step calls). Not torch's, memfit's or a training library's own functions
# (_LIBRARIES): torch's keep no user state, memfit's keep what must outlive
# a rehearsal, a library's its own bookkeeping. What such code writes
# elsewhere (a file, a logger's handlers, a tensor it updates in place
# outside the step's) is not put back. An LR scheduler such a function
# reaches (a wrapper that clips and then calls sched.step()) is put back
# through its state_dict: torch's object, not the user's, but the user's
# state all the same (find_batch_size from 8 left a OneCycleLR 22 steps on).
_PLAIN = (int, float, complex, str, bytes, bool, type(None), tuple)
_DEPTH = 3
_CONTAINER_ITEMS = 1 << 16  # a larger one (a dataset's list) is not copied each rehearsal
_MISSING = object()
_STORES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})


# Libraries whose functions keep their own state (a DeepSpeed hook's
# gathering, a Lightning loop's), which they manage themselves.
_LIBRARIES = frozenset({"torch", "memfit", "functools", "builtins", "deepspeed", "accelerate",
                        "lightning", "pytorch_lightning", "lightning_fabric", "transformers",
                        "peft", "torchao", "bitsandbytes", "timm"})


def _users(obj) -> bool:
    module = getattr(obj, "__module__", None) or ""
    # A function's own module, not the __module__ functools.wraps copied
    # onto the user's wrapper from torch's step it wraps.
    module = getattr(obj, "__globals__", {}).get("__name__", module) or ""
    return module.split(".")[0] not in _LIBRARIES


def _assigned_globals(code):
    names = {i.argval for i in dis.get_instructions(code) if i.opname in _STORES}
    for const in code.co_consts:  # a comprehension's or nested function's code
        if hasattr(const, "co_code"):
            names |= _assigned_globals(const)
    return names


class CallableState:
    """The state `functions` (and what they call, _DEPTH levels) keep:
    restore() puts it back. See Note [What the user's functions keep]."""

    def __init__(self, functions):
        self.cells, self.attrs, self.globals, self.contents = [], [], [], []
        self.owners, self.schedulers = [], []
        self._seen = set()
        for f in functions:
            self._take(f, _DEPTH)

    def _value(self, v):
        """A value the functions reach: its items, if a container; its
        state_dict, if an LR scheduler."""
        if isinstance(v, torch.optim.lr_scheduler.LRScheduler) and id(v) not in self._seen:
            self._seen.add(id(v))
            self.schedulers.append((v, copy.deepcopy(v.state_dict())))
        if (isinstance(v, CONTAINERS) and id(v) not in self._seen
                and len(v) <= _CONTAINER_ITEMS):
            self._seen.add(id(v))
            self.contents.append((v, container_contents(v)))

    def _owner(self, obj):
        """A bound method's object or a callable object of the user's: its
        public plain attributes (not a module's or an optimizer's, put back
        with the model and optimizer)."""
        if (obj is None or id(obj) in self._seen or not hasattr(obj, "__dict__")
                or isinstance(obj, (torch.nn.Module, torch.optim.Optimizer, type))
                or not _users(type(obj))):
            return
        self._seen.add(id(obj))
        d = vars(obj)
        self.owners.append((d, set(d), {k: v for k, v in d.items() if not k.startswith("_")
                                        and isinstance(v, (*_PLAIN, *CONTAINERS))}))
        for v in list(d.values()):
            self._value(v)

    def _take(self, f, depth):
        if depth < 0 or f is None or id(f) in self._seen:
            return
        if isinstance(f, functools.partial):
            self._seen.add(id(f))
            for v in (f.func, *f.args, *f.keywords.values()):
                self._value(v)
                self._take(v, depth - 1)
            return
        if hasattr(f, "__func__"):  # a bound method
            self._owner(getattr(f, "__self__", None))
            self._take(f.__func__, depth)
            return
        code = getattr(f, "__code__", None)
        if code is None:
            if callable(f) and not isinstance(f, type):
                self._owner(f)
                self._take(getattr(type(f), "__call__", None), depth - 1)
            return
        self._seen.add(id(f))
        if not _users(f):
            # torch's own wrapper (an LR scheduler's on step): what it wraps
            # may be the user's.
            for v in self._cell_values(f):
                if callable(v):
                    self._take(v, depth - 1)
            return
        self._function(f, code, depth)

    def _cell_values(self, f):
        out = []
        for cell in f.__closure__ or ():
            try:
                out.append(cell.cell_contents)
            except ValueError:  # not filled yet
                pass
        return out

    def _function(self, f, code, depth):
        for cell in f.__closure__ or ():
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            self.cells.append((cell, v))
            self._value(v)
            if callable(v):
                self._take(v, depth - 1)
        self.attrs.append((f.__dict__, dict(f.__dict__)))
        for v in f.__dict__.values():
            self._value(v)
        self._take(getattr(f, "__wrapped__", None), depth - 1)
        g = f.__globals__
        for name in _assigned_globals(code):
            self.globals.append((g, name, g.get(name, _MISSING)))
        for name in code.co_names:
            v = g.get(name, _MISSING)
            if v is _MISSING:
                continue
            self._value(v)
            if callable(v) and not isinstance(v, type):
                self._take(v, depth - 1)

    def restore(self):
        for cell, v in self.cells:
            cell.cell_contents = v
        for g, name, v in self.globals:
            if v is _MISSING:
                g.pop(name, None)
            else:
                g[name] = v
        for d, saved in self.attrs:
            for k in [k for k in d if k not in saved and not k.startswith("_")]:
                del d[k]
            d.update(saved)
        for d, keys, saved in self.owners:
            for k in [k for k in d if k not in keys and not k.startswith("_")]:
                del d[k]  # made by the rehearsal
            d.update(saved)
        for v, c in self.contents:
            put_contents_back(v, c)
        for s, saved in self.schedulers:
            s.load_state_dict(copy.deepcopy(saved))


_MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                 "_backward_pre_hooks")


def users_step_functions(how, optimizers, modules=()):
    """The functions of the user's a rehearsal runs: the step function and
    loss function of `how` (a UserStep), a wrapper set on each of
    `optimizers`' step (an instance attribute), the step pre-hooks of the
    user's, on them and global, and the hooks on `modules` (the model's)
    and the global module hooks."""
    out = ([how.step, how.loss_fn] if isinstance(how, UserStep) else [how])
    for o in optimizers:
        out.append(vars(o).get("step"))
        out += list(getattr(o, "_optimizer_step_pre_hooks", {}).values())
    out += list(getattr(torch_optimizer, "_global_optimizer_pre_hooks", {}).values())
    tables = [getattr(m, name, None) for m in modules for name in _MODULE_HOOKS]
    tables += [getattr(torch_module, "_global" + name, None) for name in _MODULE_HOOKS]
    out += [h for t in tables if isinstance(t, dict) for h in t.values()]
    return [f for f in out if f is not None]
