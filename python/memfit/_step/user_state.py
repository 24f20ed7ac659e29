"""What memfit puts back after running the user's code on the side (a profile,
a timed step, a lazy probe), so that the user's objects are left exactly as
they were: the random number generators, the model's tensors and gradients,
the optimizer's state, the inputs.

Note [A rehearsed step leaves no trace]: memfit.profile, find_batch_size
and advise run training steps the user did not ask to take, and lazy's
probes run the user's modules on a few samples. Afterwards the parameters,
buffers, .grad tensors, optimizer state and learning rate, inputs and RNG
state are exactly as before: the step runs on copies (ModelTensors swaps
copies in for the weights and buffers, their values saved in host memory;
private_copy for the inputs), and what it cannot avoid changing is put
back (kept_rng; OptimizerState; lazy's probes save the probed modules'
buffers, see graph/probe.py's leaving_no_trace). Trainer.step and
lazy's chunks run the step itself, on the user's tensors, exactly once per
sample, as an eager step would.
"""

import collections
import contextlib
import copy
import dataclasses
import inspect
import random
import sys

import torch
import torch.optim.optimizer as torch_optimizer  # its global hooks

from .._native import native as _memfit
from .batching import map_tensors
from .device import host_memory
from .offload import OffloadedOptimizer
from .optimizer_chain import OptimizerChain

__all__ = ["kept_rng"]

_MISSING = object()


class RngState:
    """The CPU's generator, each initialized CUDA device's, the
    torch.Generator objects `holders` own (See kept_rng) and Python's and
    numpy's global generators, as they are now: restore() puts them back."""

    def __init__(self, *holders):
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        # memfit's copies, not the step's: a CPU generator's state is a 5 KiB
        # tensor, which the simulated device counted beside every rehearsal
        # (a verified answer that ran out by it on the device the step runs on).
        with host_memory():
            self.cpu = torch.get_rng_state()
            self.cards = [(d, torch.cuda.get_rng_state(d)) for d in devices]
            self.states = [(g, g.get_state()) for g in _generators_of(holders)]
        self.numpy = sys.modules.get("numpy")  # a step that draws from it imported it
        self.python = random.getstate()
        self.np_state = self.numpy.random.get_state() if self.numpy else None

    def restore(self):
        random.setstate(self.python)
        if self.np_state is not None:
            self.numpy.random.set_state(self.np_state)
        torch.set_rng_state(self.cpu)
        for d, state in self.cards:
            torch.cuda.set_rng_state(state, d)
        for g, state in self.states:
            g.set_state(state)


# The enabled-flag getter of each scaled_dot_product_attention backend
# (torch.backends.cuda's, which the CPU's dispatch reads too).
_SDPA_BACKENDS = (("MATH", "math_sdp_enabled"), ("FLASH_ATTENTION", "flash_sdp_enabled"),
                  ("EFFICIENT_ATTENTION", "mem_efficient_sdp_enabled"),
                  ("CUDNN_ATTENTION", "cudnn_sdp_enabled"))


class KernelSwitches:
    """The switches that choose a step's kernels, as they are now: torch.
    autocast's state on the CPU (and CUDA where there is one) and the
    backends scaled_dot_product_attention may use (sdpa_kernel's); entered()
    runs a block under them again. A report's later probes run under those
    of the profile() that made it, not of whoever asks: profiled under bf16
    autocast and asked outside it, an MLP's peak at 512 came out 2.7% under
    the step the user runs; profiled under sdpa_kernel(MATH), an attention
    layer's 5.6x under."""

    def __init__(self):
        self.autocast = _autocast_now()
        self.sdpa = _sdpa_backends()

    @contextlib.contextmanager
    def entered(self):
        """The block under these switches. Only a switch that differs now is
        entered: an autocast region around a step that enters its own keeps
        that one's casts of the weights alive until ours exits (See Note [A
        rehearsal inside the user's autocast], record.py)."""
        with contextlib.ExitStack() as stack:
            if self.autocast != _autocast_now():
                states, cache = self.autocast
                for device, enabled, dtype in states:
                    stack.enter_context(torch.autocast(device, dtype=dtype, enabled=enabled,
                                                       cache_enabled=cache))
            if self.sdpa is not None and self.sdpa != _sdpa_backends():
                stack.enter_context(torch.nn.attention.sdpa_kernel(self.sdpa))
            yield


def _autocast_now():
    """torch.autocast's state: (device, enabled, dtype) on the CPU and, where
    there is one, CUDA; and whether it caches casts."""
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    return ([(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in devices],
            torch.is_autocast_cache_enabled())


def _sdpa_backends():
    """The SDPA backends enabled now, or None on a torch without sdpa_kernel."""
    try:
        from torch.nn import attention
    except ImportError:
        return None
    if not hasattr(attention, "sdpa_kernel"):
        return None
    flags = torch.backends.cuda
    return [getattr(attention.SDPBackend, name) for name, enabled in _SDPA_BACKENDS
            if hasattr(flags, enabled) and getattr(flags, enabled)()]


@contextlib.contextmanager
def kept_rng(*holders):
    """A block after which the CPU's generator and each initialized CUDA
    device's are back where they were: a dropout in a rehearsed step must not
    change what the user's next step draws. `holders`: objects whose own
    torch.Generator objects are put back too: a DataLoader's (its
    generator=, its sampler's and batch sampler's), so that peeking at its
    first batch leaves the order training draws as it was (a loader made
    with generator=self.g drew another order after a callback's peek).
    Python's and numpy's global generators too: a step that augments with
    random.random() or np.random drew from them in every rehearsal."""
    state = RngState(*holders)
    try:
        yield
    finally:
        state.restore()


# Note [A rehearsal runs no step post-hooks of the user's]
# profile and find_batch_size run the user's optimizer in each rehearsal (16
# times in one search), its state swapped for copies (Note [A rehearsed step
# leaves no trace]), and the step post-hooks the user registered ran each
# time: an EMA that a hook keeps (register_step_post_hook) moved 16 times
# toward the rehearsals' weights, silently. memfit cannot put back what a
# hook changes outside the step, so while a rehearsal runs the optimizer's
# own post-hooks and the global ones (register_optimizer_step_post_hook) of
# the user's are set aside (memfit.Trainer's plan is such a rehearsal: its
# probes moved the EMA 11-23 times); memfit's own stay. They run after the
# update, past the step's peak. Pre-hooks run: they shape the gradients the
# step updates from (clipping).
@contextlib.contextmanager
def no_user_post_hooks(optimizer):
    """A block in which the step post-hooks of the user's, on `optimizer`
    (and the optimizers a chain or memfit.offload wraps) and global, do not
    run: See Note [A rehearsal runs no step post-hooks of the user's]."""
    tables = [getattr(o, "_optimizer_step_post_hooks", None) for o in optimizer_tree(optimizer)]
    tables.append(getattr(torch_optimizer, "_global_optimizer_post_hooks", None))
    aside = []
    for hooks in tables:
        if isinstance(hooks, dict):
            users = {k: h for k, h in hooks.items()
                     if not (getattr(h, "__module__", None) or "").startswith("memfit.")}
            for k in users:
                del hooks[k]
            aside.append((hooks, users))
    try:
        yield
    finally:
        for hooks, users in aside:  # back in their order, ahead of any the block added
            kept = list(hooks.items())
            hooks.clear()
            hooks.update(users)
            hooks.update(kept)


def optimizer_tree(optimizer, depth=3):
    """`optimizer` and the optimizers it holds in its attributes, each once:
    a chain's, a wrapper's base optimizer (timm's Lookahead); none inside
    memfit.offload's, whose whole state OptimizerState puts back. See Note
    [An optimizer's own attributes]."""
    # A loop, not a nested function calling itself: that one is a reference
    # cycle, which kept the optimizers (and their state) alive until a GC.
    out, todo = [], [(optimizer, depth)]
    while todo:
        o, depth = todo.pop(0)
        if not isinstance(o, torch.optim.Optimizer) or any(o is q for q in out):
            continue
        out.append(o)
        if depth > 0 and not isinstance(o, OffloadedOptimizer):
            todo += [(i, depth - 1) for v in vars(o).values()
                     for i in (v if isinstance(v, (list, tuple)) else (v,))]
    return out


def optimizer_states(optimizer):
    """The state mappings of optimizer_tree(optimizer), each once: not a
    chain's own (its optimizers' routed) nor memfit.offload's (on the host)."""
    out = []
    for o in optimizer_tree(optimizer):
        if not isinstance(o, (OptimizerChain, OffloadedOptimizer)) and not any(
                o.state is st for st in out):
            out.append(o.state)
    return out


def _generators_of(holders):
    """The torch.Generator objects each holder keeps as an attribute, and
    its sampler and batch sampler (and that one's sampler) keep: each once."""
    out = []
    for h in holders:
        batches = getattr(h, "batch_sampler", None)
        for obj in (h, getattr(h, "sampler", None), batches, getattr(batches, "sampler", None)):
            for v in (vars(obj).values() if hasattr(obj, "__dict__") else ()):
                if isinstance(v, torch.Generator) and not any(v is o for o in out):
                    out.append(v)
    return out


def private_copy(obj, device=None):
    """The tensors of `obj` (nested tuple/list/dict) copied (onto `device`,
    default their own), detached from the user's autograd graph: a step run
    on them writes into none of the user's tensors (x.mul_(2) in a forward)
    and leaves no .grad on them. The copy of a tensor that requires grad
    requires grad too, so its gradient is still made (and measured)."""

    def copy_of(t):
        c = t.detach().to(device or t.device, copy=True)
        return c.requires_grad_() if t.requires_grad else c

    return map_tensors(obj, copy_of)


def _to_host(t):
    """A copy of `t`'s values in host memory: CPU RAM beside a GPU; on the
    simulated device, memory outside its budget (host_memory()). A meta
    tensor has no values: its own data is kept (it costs no memory)."""
    if t.is_meta:
        return t.detach()
    with host_memory():
        return t.detach().to("cpu", copy=True)


def storage_leaves(t):
    """The tensors that hold `t`'s memory: itself, or for a wrapper tensor
    subclass (torchao's NF4Tensor: codes, scales, ...) its inner tensors,
    which can be copied and restored in place while the wrapper stays."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    return [leaf for n in names for leaf in storage_leaves(getattr(t, n))]


# Note [State the step starts with]
# The user's next step starts with what their model and optimizer hold now:
# the weights and buffers, the optimizer's state (Adam's after a warm-up step
# or a resumed checkpoint, Adagrad's from its construction, torchao's 8-bit
# state) and any .grad the last backward left. A rehearsal that started from
# none of it measured a step the user never runs: with Adam's state held, a
# fit 1.2x too large, "verified". So each of these is a step tensor
# (step_tensors): the rehearsal swaps in a copy of it on the device it
# records on, inside the recording's "parameters" phase and classified
# (parameter, buffer, optimizer_state, gradient), and restore() puts the
# values back into the very same tensor objects. A .grad's copy is a new
# tensor (zero_grad(set_to_none=True) must free it), and the user's .grad
# waits on the host meanwhile. A step count torch keeps on the host (the
# "step" of a group neither capturable nor fused) is copied where it is.
# A default budget takes out only what lives beside these (step_bytes).
#
# A tensor a module keeps as a plain attribute (self.table = torch.randn(...),
# not a buffer) is the model's too: its plain step holds it on the device
# from the first step on. So it is a step tensor of kind "buffer": copied in,
# counted, put back. Left out, a fit ran the step beside 2 MiB it never
# counted, "verified", and the user's plain steps ran out of memory at it.
#
# A forward may also put a new tensor in a buffer's or attribute's place
# (self.n = self.n + 1, self.ema = 0.9 * self.ema + ..., a cache made at the
# first call): the rehearsal's steps then left their counts, their
# averages, or a meta tensor on the user's model. ModelTensors keeps each
# module's buffers and tensor attributes as they were (the objects, whose
# values restore() puts back) and restore() puts those objects back in
# place, dropping the ones the rehearsal added.
#
# A model also holds what it keeps in containers and in modules it does not
# register: a list or dict of tensors (self.tables = [...], a cache dict), a
# teacher kept out of the state_dict (object.__setattr__), blocks in a plain
# list instead of an nn.ModuleList. Its plain step holds them on the device
# as it holds a parameter. Left out, a fit of a model with a list of 16 MiB
# of tables answered 3840 samples, "verified", where its plain steps ran out
# of memory above 1913 (a hidden teacher: 1616, plain steps 1405). So
# model_modules() adds the modules reached through attributes (and their
# own, registered or not), whose parameters and buffers are the model's, and
# plain_tensor_attributes() looks into lists, tuples and dicts too (a few
# levels deep, containers of at most _CONTAINER_ITEMS items: a vocabulary of
# strings is not walked item by item).

# torch's own bookkeeping in a module's __dict__ (walked as registered
# parameters, buffers and children), and how far a container is looked into.
_MODULE_INTERNALS = frozenset({"_parameters", "_buffers", "_modules"})
_CONTAINER_DEPTH = 3
_CONTAINER_ITEMS = 4096


def _held_values(value, depth=_CONTAINER_DEPTH):
    """The tensors, modules and random generators an attribute holds:
    itself, or the items of a list, tuple or dict (its values), nested to
    `depth`."""
    if isinstance(value, (torch.Tensor, torch.nn.Module, torch.Generator)):
        yield value
    elif (depth > 0 and isinstance(value, (list, tuple, dict))
          and len(value) <= _CONTAINER_ITEMS):
        for v in (value.values() if isinstance(value, dict) else value):
            yield from _held_values(v, depth - 1)


def _attribute_values(module):
    """What `module` holds in its attributes (See _held_values), torch's own
    bookkeeping aside."""
    for name, value in vars(module).items():
        if name not in _MODULE_INTERNALS:
            yield from _held_values(value)


def model_modules(model):
    """model.modules(), then each module the model holds without
    registering it, with its own submodules: See Note [State the step starts
    with]. Each once."""
    modules = list(model.modules())
    known = {id(m) for m in modules}
    i = 0
    while i < len(modules):
        for v in _attribute_values(modules[i]):
            if isinstance(v, torch.nn.Module):
                for sub in v.modules():
                    if id(sub) not in known:
                        known.add(id(sub))
                        modules.append(sub)
        i += 1
    return modules


def _unique(tensors):
    seen, out = set(), []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def model_generators(model):
    """The torch.Generator objects model_modules(model) keep (noise drawn in
    a forward with generator=self.g), each once."""
    out = []
    for m in model_modules(model):
        for v in _attribute_values(m):
            if isinstance(v, torch.Generator) and not any(v is o for o in out):
                out.append(v)
    return out


def _model_devices(model):
    """The devices `model`'s registered weights and buffers are on."""
    return {t.device for t in (*model.parameters(), *model.buffers())}


def model_parameters(model):
    """The parameters of model_modules(model), then the nn.Parameter
    objects its modules hold in attributes or containers (a plain list of
    them instead of an nn.ParameterList), each once. Those it does not
    register count only on a device its registered weights are on: a copy
    kept on the host beside a CUDA model (Lightning's deep copy of the
    hyperparameters) is host memory."""
    modules = model_modules(model)
    devices = _model_devices(model)
    extra = ([p for m in modules for p in m.parameters(recurse=False)]
             + [v for m in modules for v in _attribute_values(m)
                if isinstance(v, torch.nn.Parameter)])
    return _unique([*model.parameters(),
                    *(p for p in extra if not devices or p.device in devices)])


def step_parameters(model, optimizer=None):
    """model_parameters(model), then those `optimizer` (a torch.optim
    optimizer) holds beside them: a loss module's own weights (an ArcFace
    head, a learnable temperature) trained with the model. The plain step
    holds them on the device and its optimizer.step() updates them: a
    rehearsal counts them and runs on copies of them, as of the model's."""
    params = model_parameters(model)
    if isinstance(optimizer, torch.optim.Optimizer):
        params = _unique(params + [p for g in optimizer.param_groups for p in g["params"]])
    return params


def _referenced_modules(fn, depth=2):
    """The nn.Modules a step function reads: its closure's cells and the
    globals its code names, and through the plain functions among those,
    `depth` levels down (a kd_loss(student, teacher, ...) helper)."""
    code = getattr(fn, "__code__", None)
    if code is None or not inspect.isfunction(fn):
        return []
    values = []
    for cell in fn.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet
            pass
    values += [fn.__globals__[n] for n in code.co_names if n in fn.__globals__]
    out = [v for v in values if isinstance(v, torch.nn.Module)]
    if depth > 0:
        for v in values:
            if inspect.isfunction(v) and v is not fn:
                out += _referenced_modules(v, depth - 1)
    return out


def step_modules(loss_fn):
    """The nn.Modules the loss or the user's step computes with beside the
    model: `loss_fn` itself, its module where it is a bound method of one,
    and the modules a step function (or a loss function) reads from its
    closure or globals (a teacher in distillation). loss_fn may be a
    UserStep (duck-typed: a step and a loss_fn), whose step and loss_fn are
    both looked at. Each once, in order found."""
    fns = [loss_fn]
    if not isinstance(loss_fn, torch.nn.Module) and hasattr(loss_fn, "step"):
        fns = [getattr(loss_fn, "loss_fn", None), getattr(loss_fn, "step", None)]
    found = []
    for fn in fns:
        if isinstance(fn, torch.nn.Module):
            found.append(fn)
            continue
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, torch.nn.Module):
            found.append(owner)
        found += _referenced_modules(getattr(fn, "__func__", fn))
    out = []
    for m in found:
        if not any(m is o for o in out):
            out.append(m)
    return out


def with_loss_module(model, loss_fn):
    """`model`, or where the step computes with modules of its own beside it
    (step_modules: a perceptual loss over a frozen network, class weights in
    a buffer, a distillation teacher) a container of them all, whose
    tensors are the step's as the model's are: the plain step holds those
    modules' weights on the device too. Left out, a fit beside a 4 MiB
    frozen feature network in the loss answered 509 samples, "verified",
    where plain steps ran out above 370 (a teacher read by step=: 2639,
    plain steps 2064). The user's modules are not changed: the container
    only holds them."""
    inside = model_modules(model)
    extra = [m for m in step_modules(loss_fn) if not any(m is i for i in inside)]
    return torch.nn.ModuleList([model, *extra]) if extra else model


def model_buffers(model):
    """The buffers of model_modules(model), each once; those of modules it
    does not register only on a device its registered weights are on (see
    model_parameters)."""
    devices = _model_devices(model)
    extra = [b for m in model_modules(model) for b in m.buffers(recurse=False)]
    return _unique([*model.buffers(),
                    *(b for b in extra if not devices or b.device in devices)])


@dataclasses.dataclass(frozen=True)
class StepTensor:
    """One tensor the step starts with: kind is "parameter", "buffer",
    "gradient" or "optimizer_state"; on_host: it stays on its own device (an
    optimizer's host-side step count) instead of the recorded one."""

    tensor: torch.Tensor
    kind: str
    on_host: bool = False


def _state_on_host(key, value, group):
    # torch keeps its scalar state on the CPU unless the group is capturable
    # or fused: "step", and NAdam's "mu_product", ASGD's "eta" and "mu".
    # Copied onto meta, NAdam's mu_product had no value: a warm NAdam's
    # rehearsal on meta raised ZeroDivisionError in its step.
    return value.dim() == 0 and not (group.get("capturable") or group.get("fused"))


def step_tensors(model, optimizer=None, held=True):
    """The tensors `model`'s next training step starts with (See Note [State
    the step starts with]): its parameters and buffers (a wrapper subclass's
    inner tensors), the other parameters `optimizer` holds
    (step_parameters), and with `held` the .grad already there and the state
    `optimizer` (a torch.optim optimizer whose state is on the device, not
    memfit.offload's) holds now."""
    params = step_parameters(model, optimizer)
    out = [StepTensor(leaf, "parameter") for p in params for leaf in storage_leaves(p)]
    out += [StepTensor(leaf, "buffer") for b in model_buffers(model) for leaf in storage_leaves(b)]
    out += [StepTensor(leaf, "buffer") for t in plain_tensor_attributes(model)
            for leaf in storage_leaves(t)]
    if not held:
        return out
    out += [StepTensor(p.grad, "gradient") for p in params if p.grad is not None]
    group_of = {id(p): g for o in optimizer_tree(optimizer) for g in o.param_groups
                for p in g["params"]}
    for states in optimizer_states(optimizer):
        for key, state in states.items():
            group = group_of.get(id(key), {})
            for name, v in (state.items() if isinstance(state, dict) else [(key, state)]):
                if isinstance(v, torch.Tensor):
                    host = _state_on_host(name, v, group)
                    out += [StepTensor(leaf, "optimizer_state", host)
                            for leaf in storage_leaves(v)]
    # Those it keeps outside its state: See Note [An optimizer's own attributes].
    out += [StepTensor(leaf, "optimizer_state", t.dim() == 0)
            for t in optimizer_attribute_tensors(optimizer, [s.tensor for s in out])
            for leaf in storage_leaves(t)]
    return out


# Note [An optimizer's own attributes]
# An optimizer may keep its state outside optimizer.state: momentum buffers
# in a list it makes at its first step (self.bufs = [...]), a step count in
# an int, as Shampoo-like optimizers keep per-group state in attributes.
# The rehearsal's steps made those buffers on the user's optimizer, with the
# probes' values (on meta, meta tensors), and counted the steps; a warm one's
# buffers were not counted as the state the step starts with, and its
# answer came out 1171 where plain steps ran out above 1011, "verified".
# So the tensors an optimizer keeps in its attributes (and in lists, tuples
# and dicts there) are optimizer state: copied in, counted, put back
# (step_tensors); and OptimizerState puts each attribute back as it was
# (the very objects, a list's or dict's items), dropping the ones the
# rehearsal added. An optimizer held in an attribute (timm's Lookahead keeps
# its base Adam in one) is the step's too (optimizer_tree): its state was
# neither counted nor put back, and a warm Lookahead's answer was 1011 where
# plain steps ran out above 666, "verified", the base Adam's state left as
# the probes made it.
_OPTIMIZER_INTERNALS = frozenset({"state", "param_groups", "defaults", "_opt_called"})


def _own_attributes(optimizer):
    """(optimizer, its (name, value) attributes) for each of
    optimizer_tree(optimizer), torch's bookkeeping aside: See Note [An
    optimizer's own attributes]; none for memfit.offload's, whose whole
    state OptimizerState puts back."""
    for o in optimizer_tree(optimizer):
        if not isinstance(o, OffloadedOptimizer):
            yield o, [(k, v) for k, v in vars(o).items()
                      if k not in _OPTIMIZER_INTERNALS and not k.startswith("_optimizer_")]


def optimizer_attribute_tensors(optimizer, known=()):
    """The tensors `optimizer` keeps in attributes of its own, not among
    `known` (the parameters and state already found) nor sharing their
    memory, leaves on a device those are on: See Note [An optimizer's own
    attributes]."""
    values = (v for _, attributes in _own_attributes(optimizer)
              for _, value in attributes for v in _held_values(value))
    return _unseen_leaves(values, known)


def _unseen_leaves(values, known):
    """The plain tensors among `values`, each once: not a Parameter, no
    autograd history (a tensor kept with its graph is the last step's), not
    among `known` nor sharing memory with one of them, and on a device
    `known` are on."""
    devices = {t.device for t in known}
    ids = {id(t) for t in known}
    storages = {_storage_key(t) for t in known} - {None}
    out = []
    for v in values:
        if (not isinstance(v, torch.Tensor) or isinstance(v, torch.nn.Parameter)
                or v.grad_fn is not None or id(v) in ids
                or (devices and v.device not in devices)):
            continue
        key = _storage_key(v)
        if key is not None and key in storages:
            continue
        ids.add(id(v))
        if key is not None:
            storages.add(key)
        out.append(v)
    return out


def _storage_key(t):
    try:
        return t.untyped_storage().data_ptr() if not t.is_meta else None
    except (RuntimeError, NotImplementedError):  # a wrapper subclass: see storage_leaves
        return None


def plain_tensor_attributes(model):
    """The tensors `model`'s modules keep as plain attributes (not
    parameters or buffers, nor views of them), each once: See Note [State
    the step starts with]. Only leaves (no autograd history): a tensor kept
    with its graph is the last step's, not the model's; and only on a device
    the weights are on: a table a CUDA model keeps on the host is host
    memory. Lists, tuples and dicts of tensors and the modules the model
    does not register are looked into (model_modules)."""
    registered = [*model_parameters(model), *model_buffers(model)]
    values = (v for module in model_modules(model) for v in _attribute_values(module))
    return _unseen_leaves(values, registered)


def _tensor_slots(model):
    """Each module's buffers and tensor attributes (and those set to None,
    a cache not made yet), and its attributes that are containers holding
    tensors (a cache kept as a tuple): what restore() puts back in place."""
    return [(m, dict(m._buffers),
             {k: v for k, v in vars(m).items()
              if v is None or (isinstance(v, torch.Tensor)
                               and not isinstance(v, torch.nn.Parameter))},
             {k: v for k, v in vars(m).items() if _holds_tensors(v)})
            for m in model_modules(model)]


# Note [A cache a forward keeps in a container]
# A forward may keep tensors in a tuple or list it puts in an attribute
# (self.cache = (k.detach(), v.detach()), a key/value cache across calls).
# Left by a rehearsal, the user's model held the last probe's cache (93
# samples of it) after find_batch_size, each probe read the one before's
# (its answer 0.886 of what plain steps run, "not affine"), and on meta the
# next rehearsal mixed a CPU cache into meta tensors and raised. So such an
# attribute is put back as the very object it was, None included, and one
# the rehearsal made is dropped, as a tensor attribute is.
def _holds_tensors(value):
    """Whether `value` is a list, tuple or dict holding a tensor (a few
    levels deep): See Note [A cache a forward keeps in a container]."""
    return isinstance(value, (list, tuple, dict)) and any(
        isinstance(v, torch.Tensor) for v in _held_values(value))


def _exact_aliases(slots, tensors):
    """(attribute, step tensor) for each tensor attribute that is another
    name for the whole of a step tensor (self.weight = weight.data, as the
    old spectral_norm keeps it): restore() gives the step tensor new memory,
    and the attribute is made to share it again, not left holding a stale
    second copy."""
    by_ptr = {t.data_ptr(): t for t in tensors if not t.is_meta and t.layout == torch.strided}
    out = []
    for _, _, attributes, _ in slots:
        for v in attributes.values():
            if v is None or v.is_meta or v.layout != torch.strided:
                continue
            t = by_ptr.get(v.data_ptr())
            if (t is not None and t is not v and v.dtype == t.dtype and v.shape == t.shape
                    and v.stride() == t.stride() and v.device == t.device):
                out.append((v, t))
    return out


def _put_slots_back(slots):
    for module, buffers, attributes, held in slots:
        now = module._buffers
        for name in [n for n in now if n not in buffers]:
            del now[name]  # registered by the rehearsal's forward
        for name, b in buffers.items():
            if now.get(name, _MISSING) is not b:
                now[name] = b
        d = vars(module)
        for name in [n for n, v in d.items() if n not in attributes
                     and isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter)]:
            del d[name]  # a tensor attribute the rehearsal's forward made
        for name in [n for n, v in d.items() if n not in attributes and n not in held
                     and _holds_tensors(v)]:
            del d[name]  # See Note [A cache a forward keeps in a container]
        for name, v in attributes.items():
            now_v = d.get(name, _MISSING)
            if now_v is not v and (v is not None or isinstance(now_v, torch.Tensor)
                                   or _holds_tensors(now_v)):
                d[name] = v  # a None stays replaced unless tensors took its place
        for name, v in held.items():
            d[name] = v


# Note [A forward's counters]
# A forward may keep Python values of its own on the model: a count of its
# calls, a scale it decays each step, a list of what it saw. The
# rehearsal's 16 forwards in one find_batch_size left a counter at 16 and a
# decayed scale at 0.85 on the user's model, silently. So each module's
# public numbers and strings, and the items of its public lists and dicts
# (and of those in them), are put back as they were (the very containers);
# tensors are the step tensors' (Note [State the step starts with]);
# training is train_mode's.
def _plain_values(model):
    """(module, name, value, contents) for each public attribute of
    model_modules(model) that is a number or a string (contents None), or a
    list or dict (its container_contents): See Note [A forward's counters]."""
    out = []
    for m in model_modules(model):
        for k, v in vars(m).items():
            if k.startswith("_") or k == "training":
                continue
            if isinstance(v, (list, dict, int, float, str)):
                out.append((m, k, v, container_contents(v)))
    return out


def _put_values_back(values):
    for module, name, value, contents in values:
        vars(module)[name] = value
        put_contents_back(value, contents)


def step_bytes(model, optimizer=None, counted=None, held=True):
    """Bytes of the storages `model`'s next step starts with
    (step_tensors(model, optimizer, held)) for which counted(tensor) is true
    (default: all), each storage once."""
    seen, total = set(), 0
    for s in step_tensors(model, optimizer, held):
        t = s.tensor
        if t.is_meta or (counted is not None and not counted(t)):
            continue
        key = t.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


class ModelTensors:
    """A model's parameters and buffers set aside while memfit runs a step on
    copies of them (see swap_in_copies), and each parameter's .grad; restore()
    puts the values back into the same Parameter and buffer objects, exactly,
    and the very same .grad tensors. With `held` (and an `optimizer`), the
    step starts with the .grad and the optimizer's state held now, copied
    too: See Note [State the step starts with]; else it starts after
    zero_grad(set_to_none=True), with no .grad.

    The saved values wait in host memory, not on the device: a profile must
    not need a second copy of the weights on the card it measures (the
    device originals are released when the copies come in, unless the user
    holds views of them). So restore() gives each tensor fresh storage with
    the saved values: a view of a weight taken before the profile no longer
    aliases it afterwards. A tensor that is itself a view into a larger
    storage (weights laid out in one flat buffer the user's optimizer
    steps, .grad views of a bucket) keeps that storage, which the rehearsal
    never writes: restore() makes it that very view again. Given fresh
    storage, the weights no longer followed the flat buffer, and the user's
    next step updated a buffer the model no longer read.

    A model on the meta device (built under `with torch.device("meta")`)
    has shapes without values: nothing is copied to the host, and restore()
    gives each tensor back the very meta data it had."""

    def __init__(self, model, optimizer=None, held=False):
        self.parameters = step_parameters(model, optimizer)
        self.slots = _tensor_slots(model)  # See Note [State the step starts with]
        self.values = _plain_values(model)  # See Note [A forward's counters]
        self.entries = step_tensors(model, optimizer, held)
        self.aliases = _exact_aliases(self.slots, [e.tensor for e in self.entries])
        self.tensors = [e.tensor for e in self.entries]
        self.saved = [(_to_host(t), t.device) for t in self.tensors]
        self.views = _shared_storages(self.tensors)
        # A generator the model draws from (torch.randn(..., generator=self.g))
        # is put back as kept_rng puts back the global ones: a rehearsal's
        # draws advanced it, and the user's next step drew other noise.
        self.generators = [(g, g.get_state()) for g in model_generators(model)]
        self.grads = [p.grad for p in self.parameters]
        self.held_grads = [held and g is not None for g in self.grads]
        self.optimizer = optimizer if held else None
        # The optimizer's state dicts as they are: a rehearsal's step may add
        # entries or replace values; restore() puts these back.
        self.state = [(states, {k: (v, dict(v) if isinstance(v, dict) else None)
                                for k, v in states.items()})
                      for states in optimizer_states(self.optimizer)]
        for p in self.parameters:
            p.grad = None
        for e in self.entries:
            if e.kind == "gradient":  # waits on the host: its copy is the step's
                _memfit.set_data(e.tensor, _empty_like(e.tensor))

    def swap_in_copies(self, device=None, classify=None):
        """Give every parameter and buffer (and with `held`, the optimizer's
        state and each .grad) a copy of its values (on `device`, default its
        own; an optimizer's host-side step count where it is); classify(tensor,
        kind) is told of each."""
        self.reset_optimizer_state()
        with torch.no_grad():
            copies = []
            for e, (value, was) in zip(self.entries, self.saved):
                where = was if (device is None or e.on_host) else device
                c = value.to(where, copy=True)
                if e.kind == "gradient":
                    copies.append(c)
                else:
                    _memfit.set_data(e.tensor, c)
                    c = e.tensor
                if classify is not None:
                    classify(c, e.kind)
            grads = iter(copies)
        for p, held in zip(self.parameters, self.held_grads):
            if held:
                p.grad = next(grads)

    def reset_optimizer_state(self):
        """The optimizer's state dicts as they were when saved: what a
        rehearsal's step added or replaced is dropped (the values of the
        tensors come back with restore())."""
        for states, saved in self.state:
            states.clear()
            for key, (d, items) in saved.items():
                if items is not None:  # else a value of its own: See state_values
                    d.clear()
                    d.update(items)
                states[key] = d

    def restore(self):
        for g, state in self.generators:
            g.set_state(state)
        for p in self.parameters:
            p.grad = None  # the rehearsal's
        self.reset_optimizer_state()
        _put_slots_back(self.slots)  # the very tensors, before their values
        _put_values_back(self.values)
        with torch.no_grad():
            for t, (value, device), view in zip(self.tensors, self.saved, self.views):
                if view is not None:  # its own memory, untouched: the very view again
                    _memfit.set_data(t, view)
                else:
                    _memfit.set_data(t, value if value.is_meta else value.to(device, copy=True))
        # After the data: a .grad must match its parameter's device and dtype.
        for p, g in zip(self.parameters, self.grads):
            p.grad = g
        for alias, t in self.aliases:  # still the weight's memory, not a second copy
            if not t.is_meta and alias.data_ptr() != t.data_ptr():
                _memfit.set_data(alias, t.detach())


def _shared_storages(tensors):
    """For each of `tensors`, t.detach() (its very memory) where it holds
    part of a larger storage (an offset into it, fewer bytes than it has) or
    shares its storage with another of `tensors` (a flat buffer and the
    weights laid out in it), else None: See ModelTensors."""
    keys = [_storage_key(t) if not t.is_meta and t.layout == torch.strided else None
            for t in tensors]
    sharing = {}
    for k in keys:
        if k is not None:
            sharing[k] = sharing.get(k, 0) + 1
    out = []
    for t, k in zip(tensors, keys):
        partial = k is not None and (
            t.storage_offset() != 0
            or t.untyped_storage().nbytes() != t.numel() * t.element_size())
        out.append(t.detach() if k is not None and (partial or sharing[k] > 1) else None)
    return out


def _empty_like(t):
    """No storage, on `t`'s device and of its dtype: what a tensor whose
    values wait on the host holds meanwhile."""
    return torch.empty(0, dtype=t.dtype, device=t.device)


class OptimizerState:
    """An optimizer's hyperparameters (its learning rate included), put back
    by restore() after memfit's steps updated them. Its state tensors are
    step tensors, put back by ModelTensors (See Note [State the step starts
    with]), but for memfit.offload's, whose state is on the host: that one's
    whole state_dict is put back."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.whole = (copy.deepcopy(optimizer.state_dict())
                      if isinstance(optimizer, OffloadedOptimizer) else None)
        # A tensor hyperparameter (lr=torch.tensor(1e-3)) is the user's object,
        # which their scheduler fills in place: its values come back into it.
        self.groups = [{k: (v, _to_host(v) if isinstance(v, torch.Tensor) else copy.deepcopy(v))
                        for k, v in g.items() if k != "params"}
                       for g in optimizer.param_groups]
        # An LR scheduler's wrapper of step() sets this flag (it silences
        # the scheduler's "step() before optimizer.step()" warning).
        self.called = optimizer.__dict__.get("_opt_called", _MISSING)
        # See Note [An optimizer's own attributes].
        self.attributes = [(o, [(k, v, container_contents(v)) for k, v in attributes])
                           for o, attributes in _own_attributes(optimizer)]

    def restore(self):
        if self.whole is not None:
            self.optimizer.load_state_dict(self.whole)
        for group, saved in zip(self.optimizer.param_groups, self.groups):
            for k, (was, value) in saved.items():
                if isinstance(was, torch.Tensor) and not was.is_meta:
                    with torch.no_grad():
                        _memfit.set_data(was, value.to(was.device, copy=True))
                    value = was
                group[k] = value
        if self.called is _MISSING:
            self.optimizer.__dict__.pop("_opt_called", None)
        else:
            self.optimizer._opt_called = self.called
        for o, attributes in self.attributes:
            d = vars(o)
            for k in {k for k, _ in _own_attributes_of(o)} - {k for k, _, _ in attributes}:
                del d[k]  # made by the rehearsal's steps
            for k, v, contents in attributes:
                d[k] = v
                put_contents_back(v, contents)


def _own_attributes_of(o):
    return next(iter(_own_attributes(o)), (None, []))[1]


# The containers whose items a rehearsal puts back in the very container
# (a list of logged values, a dict cache, a set, a deque of recent losses).
CONTAINERS = (list, dict, set, collections.deque)


def container_contents(value, depth=2):
    """A container's items (See CONTAINERS), and those of the containers
    among them (to `depth`): what put_contents_back puts back in the very
    containers. None for anything else."""
    if not isinstance(value, CONTAINERS):
        return None
    items = dict(value) if isinstance(value, dict) else list(value)
    inner = [(v, container_contents(v, depth - 1))
             for v in (items.values() if isinstance(items, dict) else items)
             if depth > 1 and isinstance(v, CONTAINERS)]
    return items, inner


def put_contents_back(value, contents):
    """Puts container_contents(value) back into `value` itself."""
    if contents is None:
        return
    items, inner = contents
    if isinstance(value, list):
        value[:] = items
    else:  # a dict, deque or set
        value.clear()
        (value.update if isinstance(value, (dict, set)) else value.extend)(items)
    for v, c in inner:
        put_contents_back(v, c)
