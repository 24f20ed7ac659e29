"""Watching the user's loop: each torch call the user's code makes (its line
and the timeline events it caused), the model's forwards, the optimizers'
steps and zero_grad calls.

Note [How the doctor attributes memory]: memfit's tracking allocator records
every allocation and free in the timeline. A TorchFunctionMode sees each
torch call the user's code makes (calls made inside torch are not seen
again: the mode is off while its handler runs); the timeline's length
before and after the call brackets the events the call caused, and the
innermost frame outside torch and memfit is the user's line. So every byte
is measured by the allocator and named by a line, at the cost of one Python
handler per torch call, not per allocation. An optimizer's step and
zero_grad count as one call each (their own torch calls are not looked at),
which keeps the overhead of a step's optimizer off the measurement.

Everything installed here (the mode, the module and optimizer hooks, the
zero_grad wrappers, the hooks on autograd nodes) is removed by stop(), also
after an exception. Nothing changes what the loop computes.
"""

import functools
import linecache
import re
import sys
import weakref

import torch
import torch.nn.functional as F
import torch.optim.optimizer as optimizer_hooks
from torch.nn.modules import module as module_hooks
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from .._native import native as _memfit
from .._step.compiled import CompileWatch, compiled_roots, module_calls, watch_call
from .._step.optimizer_chain import state_values
from .frames import called_from_other_library, is_library_file, site_of, user_frame
from .records import (CompileEvent, Float64Tensor, ForwardCall, GraphUse, HostCopy,
                      InPlaceCandidate, Marker, Observation, RetainedBackward, Span,
                      ZeroGradCall)

__all__ = ["StopRun"]


class StopRun(BaseException):
    """Raised from inside the user's loop once the requested number of steps
    was observed (the doctor command's --steps). A BaseException, so that a
    loop's `except Exception` does not swallow it."""


_allocation_id = _memfit.allocation_id
_Tensor = torch.Tensor


def _arg(args, kwargs, pos, name, default):
    if len(args) > pos:
        return args[pos]
    return kwargs.get(name, default)


# Out-of-place ops that have an in-place form autograd accepts (their
# backward needs the result or nothing, never the overwritten input):
# func -> (name in reports, the in-place spelling, position of its `inplace`
# argument or None, what else to check).
_IN_PLACE = {
    F.relu: ("F.relu", "F.relu(x, inplace=True) / nn.ReLU(inplace=True)", 1, ""),
    torch.relu: ("torch.relu", "torch.relu_(x)", None, ""),
    _Tensor.relu: ("Tensor.relu", "x.relu_()", None, ""),
    F.relu6: ("F.relu6", "F.relu6(x, inplace=True) / nn.ReLU6(inplace=True)", 1, ""),
    F.hardtanh: ("F.hardtanh", "F.hardtanh(x, inplace=True) / nn.Hardtanh(inplace=True)", 3, ""),
    F.leaky_relu: ("F.leaky_relu", "F.leaky_relu(x, inplace=True) / nn.LeakyReLU(inplace=True)",
                   2, "slope"),
    F.elu: ("F.elu", "F.elu(x, inplace=True) / nn.ELU(inplace=True)", 2, "alpha"),
    F.dropout: ("F.dropout", "F.dropout(x, p, inplace=True) / nn.Dropout(p, inplace=True)", 3,
                "dropout"),
    torch.sigmoid: ("torch.sigmoid", "torch.sigmoid_(x)", None, ""),
    _Tensor.sigmoid: ("Tensor.sigmoid", "x.sigmoid_()", None, ""),
    torch.tanh: ("torch.tanh", "torch.tanh_(x)", None, ""),
    _Tensor.tanh: ("Tensor.tanh", "x.tanh_()", None, ""),
    _Tensor.__add__: ("+", "x += y", None, "add"),
    _Tensor.add: ("Tensor.add", "x.add_(y)", None, "add"),
    torch.add: ("torch.add", "x.add_(y)", None, "add"),
}
_COPIES = (_Tensor.to, _Tensor.cuda, _Tensor.copy_)
_SPECIAL = {f: "in_place" for f in _IN_PLACE}
_SPECIAL.update({f: "copy" for f in _COPIES})
# Backward's two spellings, each with the position of retain_graph and
# create_graph: loss.backward(gradient, retain_graph, create_graph) and
# torch.autograd.backward(tensors, grad_tensors, retain_graph, create_graph).
_BACKWARDS = {_Tensor.backward: (2, 3), torch.autograd.backward: (2, 3)}
# Calls that move a tensor to the host: on the CPU that rehearses a GPU run
# they return the same storage, which the GPU run keeps in host memory.
_TO_HOST = {_Tensor.cpu, _Tensor.to, _Tensor.numpy}
# Calls that copy a tensor (a parameter's: copy.deepcopy(model), a state
# dict's clone for the best weights so far).
_CLONES = {_Tensor.clone, torch.clone}
_SPECIAL.update({f: "backward" for f in _BACKWARDS})

# The in-place spelling of each op, by its name in reports (for the checks).
IN_PLACE_FIXES = {name: fix for name, fix, _pos, _check in _IN_PLACE.values()}


def func_name(func):
    """`Tensor.add`, `relu`, `optimizer.step`: a call's name for reports."""
    if isinstance(func, str):
        return func
    name = getattr(func, "__name__", None) or repr(func)
    owner = getattr(func, "__objclass__", None)
    if owner is torch._C.TensorBase or getattr(func, "__qualname__", "").startswith("Tensor."):
        return "Tensor." + name
    return name


def _tensors(obj):
    return [t for t in pytree.tree_leaves(obj) if isinstance(t, _Tensor)]


def _cache_tensors(cache):
    """The tensors of an HF KV cache: a DynamicCache's layers' keys and
    values (transformers 5), its key_cache/value_cache lists (4.x), or a
    legacy tuple of (key, value) pairs."""
    out = [t for t in pytree.tree_leaves(cache) if isinstance(t, _Tensor)]
    for layer in getattr(cache, "layers", None) or ():
        out += [t for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                if isinstance(t, _Tensor)]
    for name in ("key_cache", "value_cache"):
        out += [t for t in getattr(cache, name, None) or () if isinstance(t, _Tensor)]
    return out


def kv_cache_bytes(output):
    """Bytes of the KV cache a model's output carries (HF's past_key_values),
    each storage once; 0 when it carries none."""
    cache = _cache_of(output)
    if cache is None:
        return 0
    storages = {}
    for t in _cache_tensors(cache):
        if t.device.type != "meta":
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def _cache_of(output):
    return (output.get("past_key_values") if isinstance(output, dict)
            else getattr(output, "past_key_values", None))


class _ModuleHook:
    """A hook the doctor puts on the model. A copy of the model made inside
    the block (copy.deepcopy for an EMA or the best weights so far,
    torch.save of the whole model) gets a hook that does nothing: the copy
    is not the model watched, and the observer behind the hook holds the
    timeline, which cannot be copied (the copy raised). That hook is `"".
    __init__`, pickled as builtins' getattr("", "__init__"): it takes any
    arguments and returns None (str keeps object's __init__, which lets
    them pass), so a model saved inside the block loads where memfit is not
    installed (a class of memfit's own there did not)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __reduce__(self):
        return (getattr, ("", "__init__"))


def _hook_site(fn):
    """The line of the user's forward hook `fn` that stores what it is given
    (`.append(`, `acts[name] = `); None for a hook that stores nothing (a
    log of `.mean().item()`) and for a library's or the doctor's."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if isinstance(fn, _ModuleHook):
        return None
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:  # a callable object
        code = getattr(getattr(type(fn), "__call__", None), "__code__", None)
    if code is None or is_library_file(code.co_filename):
        return None
    stores = re.compile(r"\.append\(|\]\s*=(?!=)|\+=\s*\[")
    for line in sorted({n for *_, n in code.co_lines() if n}):
        if stores.search(linecache.getline(code.co_filename, line)):
            return site_of((code.co_filename, line, code.co_name))
    return None


def _next_allocation_id():
    # Ids count tracked allocations on every device from 1 (see
    # src/torch/tracking.cpp): the next one is one past their number.
    return 1 + _memfit.allocation_count("cpu") + _memfit.allocation_count("meta")


class _Calls(TorchFunctionMode):
    """The mode that sees the user's torch calls; the work is the
    Observer's."""

    def __init__(self, observer):
        super().__init__()
        self._o = observer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        o = self._o
        if o.quiet:
            return func(*args, **kwargs)
        timeline = o.timeline
        n0 = len(timeline)
        if o.pending:
            o.note_uses(args)
        watch = o.watch_backward(func, args, kwargs) if func in _BACKWARDS else None
        try:
            out = func(*args, **kwargs)
        finally:
            if watch is not None:
                o.end_backward(watch, n0, len(timeline))
        if func in _TO_HOST:
            o.note_host(func, args, kwargs, out)
        elif func in _CLONES and len(timeline) != n0:
            o.note_clone(args, out)
        if len(timeline) != n0 or func in _SPECIAL:
            o.note_call(func, args, kwargs, out, n0, len(timeline))
        elif isinstance(out, _Tensor) and out.requires_grad:
            o.note_graph_inputs(func, args, n0, 2)
        return out


class Observer:
    """Records what the user's loop does while started. `model` and
    `optimizer` narrow what counts as a forward and a step; None means any
    outermost module call and any optimizer."""

    def __init__(self, tracking, model=None, optimizer=None, max_steps=None):
        self.timeline = tracking.timeline
        self._tracking = tracking
        self.model = model
        self.optimizer = optimizer
        self.max_steps = max_steps
        # Set once StopRun was raised: raised again at every forward and
        # step, should the loop swallow it (`except BaseException: pass`).
        self.stopping = False
        self.quiet = False
        self.spans = []
        self.markers = []
        self.forwards = []
        self.zero_grads = []
        self.accumulations = []  # (event, id of the parameter, bytes of its .grad)
        self.retained = []  # RetainedBackward's fields, but the key for its site
        # id(grad_fn) -> the allocations of the results it made, this step
        # (an autograd node cannot be weakly referenced, and a strong one
        # would keep what it saved alive).
        self._creators = {}
        self._accumulating = set()  # ids of the parameters with our hook
        self.graph_uses = []
        self.float64 = []
        self.copies = []
        self.host_ids = set()  # allocations the user moved to the host (note_host)
        self.weight_copies = set()  # allocations that copy a parameter (note_clone)
        self.hook_outputs = {}  # allocation id -> the Site of the user's hook given it
        self._user_hooked = set()  # ids of the modules whose user hook is watched
        self._compiled_models = {}  # id(model) -> whether it has compiled parts
        self.candidates = []  # [input_id, output_id, event, key, name, module, used_later]
        self.pending = {}  # input id -> (candidate index, weakref to the input)
        self.optimizer_steps = 0
        # (module, args, kwargs) of the last forward from each line, for the
        # trials; `last_inputs` the last forward's.
        self.inputs = {}
        self.last_inputs = None
        self._has_params = {}
        self._seen = set()  # (what, boundary) recorded once per step
        self._optimizers = []
        self._seen_steppers = []  # optimizers whose step() began, finished or not
        self._hooked = set()  # ids of the modules whose forward has our post-hook
        self._root = None  # (module, ForwardCall) of the forward running
        self._forwards_since_step = 0
        self._step_open = None
        self._module_names = {}
        self._undo = []
        self._mode = None
        self.compiles = []  # CompileEvent of each compiled call that compiled
        self._compiled_seen = set()  # ids of the models whose compiled parts are watched
        self._compile_calls = []  # (CompileWatch, mode suspended, shapes) of calls running
        self._model_files = set()

    # -- starting and stopping -------------------------------------------

    def start(self):
        """Installs the mode and hooks. Undone by stop(), also when start()
        itself fails half way."""
        self._first_id = _next_allocation_id()
        self._boundary_id = self._first_id
        if self.model is not None:
            self._module_names = {m: (name or type(m).__name__)
                                  for name, m in self.model.named_modules()}
        try:
            self._install()
        except BaseException:
            self._uninstall()
            raise

    def _install(self):
        # A named model gets hooks of its own; else a global pre-hook finds
        # the model (see _is_model) and hooks it. Hooks on every module
        # would put each module call on torch's slow path.
        if self.model is not None:
            self._watch_compiled(self.model)
            root = next(how for path, _, how in module_calls(self.model) if not path)
            if root == "wrap":  # compiled in place: its hooks would run in compiled code
                def post(module, args, output):
                    self._forward_post(module, args, {}, output)

                self._hooked.add(id(self.model))
                self._undo += [h.remove for h in
                               watch_call(self.model, root, self._forward_pre, post)]
            else:
                pre = self.model.register_forward_pre_hook(_ModuleHook(self._forward_pre))
                self._undo.append(pre.remove)
                self._hook_post(self.model)
        else:
            pre = module_hooks.register_module_forward_pre_hook(self._forward_pre)
            self._undo.append(pre.remove)
        step_pre = optimizer_hooks.register_optimizer_step_pre_hook(self._step_pre)
        self._undo.append(step_pre.remove)
        step_post = optimizer_hooks.register_optimizer_step_post_hook(self._step_post)
        self._undo.append(step_post.remove)
        for cls in (torch.optim.Optimizer, torch.nn.Module):
            original = cls.__dict__["zero_grad"]
            setattr(cls, "zero_grad", self._zero_grad_wrapper(original))
            self._undo.append(functools.partial(setattr, cls, "zero_grad", original))
        mode = self._mode = _Calls(self)
        mode.__enter__()
        self._undo.append(self._remove_mode)

    # -- compiled modules ---------------------------------------------------

    # Note [The doctor beside compiled code]
    # dynamo traces what runs inside compiled code: the mode's handler there
    # would break the graph at every torch call, and recompile it (64 frames
    # for a 6-layer MLP, the recompile limit hit). So a compiled module's
    # call runs with the mode off, its inside seen as one call whose
    # allocations the timeline still records, and under a CompileWatch:
    # what compiled during the loop (recompiles, graph breaks) is recorded
    # for the checks in compile_checks.py.
    def _watch_compiled(self, model, args=None):
        """Watch the calls of the compiled parts of `model` (See Note [The
        doctor beside compiled code]); `args`: `model` is being called now
        (its own pre-hook missed this call)."""
        if id(model) in self._compiled_seen:
            return
        self._compiled_seen.add(id(model))
        for m in model.modules():
            path = sys.modules.get(type(m).__module__)
            file = getattr(path, "__file__", None)
            if file and not is_library_file(file):
                self._model_files.add(file)
        roots = compiled_roots(model)
        devices = {p.device.type for p in model.parameters()}
        if roots and devices == {"cpu"}:
            # What compiling allocates on the meta device (fake tensors the
            # caches keep) is not the loop's memory.
            self._tracking.only_device("cpu")
        for _, m, how in roots:
            self._undo += [h.remove for h in
                           watch_call(m, how, self._compiled_pre, self._compiled_post)]
            if args is not None and m is model:
                self._compiled_pre(m, args)

    def _compiled_pre(self, module, args):
        watch = CompileWatch().__enter__()
        shapes = tuple(tuple(t.shape) for t in _tensors(args))
        self._compile_calls.append((watch, self._suspend(), shapes))

    def _compiled_post(self, module, args, output):
        if not self._compile_calls:
            return
        watch, suspended, shapes = self._compile_calls.pop()
        watch.__exit__(None, None, None)
        self._resume(suspended)
        if watch.cost.compiled:
            forward = len(self.forwards) - 1
            site = self.forwards[-1].site if self.forwards else site_of(user_frame(1))
            self.compiles.append(CompileEvent(self.optimizer_steps, forward, site, watch.cost,
                                              shapes))

    def _remove_mode(self):
        if torch.overrides._get_current_function_mode() is self._mode:
            self._mode.__exit__(None, None, None)
        self._mode = None

    def _suspend(self):
        """Takes the mode off torch's stack while torch's own code runs for
        the user (an optimizer's step, zero_grad), so that its calls cost no
        Python handler. True if it did (then _resume puts it back)."""
        if self._mode is not None and torch.overrides._get_current_function_mode() is self._mode:
            torch._C._pop_torch_function_stack()
            return True
        return False

    def _resume(self, suspended):
        if suspended and self._mode is not None:
            torch._C._push_on_torch_function_stack(self._mode)

    def _uninstall(self):
        errors = []
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception as e:  # keep undoing the rest
                errors.append(e)
        if errors:
            raise errors[0]

    def stop(self):
        """Removes everything start() installed and returns the
        Observation."""
        end = len(self.timeline)
        try:
            self._uninstall()
        finally:
            self.quiet = False
            self.pending = {}
        return Observation(
            spans=tuple(Span(a, b, site_of(k), func_name(f), g) for a, b, k, f, g in self.spans),
            markers=tuple(Marker(*m) for m in self.markers),
            forwards=tuple(self.forwards),
            zero_grads=tuple(ZeroGradCall(e, site_of(k), s) for e, k, s in self.zero_grads),
            graph_uses=tuple(GraphUse(i, e, site_of(k), func_name(f))
                             for i, e, k, f in self.graph_uses),
            float64=tuple(Float64Tensor(i, e, site_of(k), func_name(f), b)
                          for i, e, k, f, b in self.float64),
            copies=tuple(HostCopy(e, site_of(k), b, p, nb, d) for e, k, b, p, nb, d in self.copies),
            in_place=tuple(InPlaceCandidate(c[0], c[1], c[2], site_of(c[3]), c[4], c[5], c[6])
                           for c in self.candidates),
            held_ids=frozenset(self._ids(_tensors([i[1:] for i in self.inputs.values()]))),
            host_ids=frozenset(self.host_ids),
            hook_outputs=tuple(self.hook_outputs.items()),
            weight_copies=frozenset(self.weight_copies),
            end_event=end,
            outside_bytes=self._outside_bytes(),
            compiles=tuple(self.compiles),
            model_files=frozenset(self._model_files),
            accumulations=tuple(self.accumulations),
            retained=tuple(RetainedBackward(a, b, site_of(k), r) for a, b, k, r in self.retained),
        )

    def _outside_bytes(self):
        """Bytes of parameters, buffers and optimizer state memfit did not
        allocate during the run, each storage once."""
        tensors = []
        modules = [self.model] if self.model is not None else [
            m for m, has in self._has_params.items() if has]
        for m in modules:
            tensors += list(m.parameters()) + list(m.buffers())
        for opt in self._optimizers:
            for entry in opt.state.values():
                tensors += [v for v in state_values(entry) if isinstance(v, _Tensor)]
        seen, total = set(), 0
        for t in tensors:
            if t.device.type == "meta" or _allocation_id(t) is not None:
                continue
            storage = t.untyped_storage()
            key = (t.device, storage.data_ptr())
            if key not in seen:
                seen.add(key)
                total += storage.nbytes()
        return total

    # -- step boundaries ---------------------------------------------------

    def _new_boundary(self):
        self._boundary_id = _next_allocation_id()

    def _hook_post(self, module):
        if id(module) not in self._hooked:
            self._hooked.add(id(module))
            post = module.register_forward_hook(_ModuleHook(self._forward_post),
                                                with_kwargs=True, always_call=True)
            self._undo.append(post.remove)

    def _forward_pre(self, module, args):
        if self.quiet or self._root is not None:
            return
        if self.model is None:
            if not self._is_model(module):
                return
            self._hook_post(module)  # torch runs it at the end of this very call
            self._watch_compiled(module, args)
        self.quiet = True  # reading .grad below is ours, not the user's
        try:
            n = len(self.timeline)
            if self.stopping:
                raise StopRun()  # a loop swallowed the last one
            if (self.max_steps and not self.optimizer_steps
                    and len(self.forwards) >= self.max_steps):
                self.markers.append((n, "forward"))
                self.stopping = True
                raise StopRun()
            self.markers.append((n, "forward"))
            self._new_boundary()
            present = None
            if self.optimizer_steps and self._forwards_since_step == 0:
                present = sum(p.grad.numel() * p.grad.element_size()
                              for p in self.params() if p.grad is not None)
                self._watch_accumulation()
            self._forwards_since_step += 1
            if module not in self._module_names:
                self._module_names.update((m, name or type(m).__name__)
                                          for name, m in module.named_modules())
            site = site_of(user_frame(1))
            # The inputs held for the trials go before this forward runs, as
            # the loop's own reference to them usually does.
            self.inputs.pop(site, None)
            self.last_inputs = None
            call = ForwardCall(index=len(self.forwards), site=site,
                               first_event=n, end_event=n, grad_enabled=torch.is_grad_enabled(),
                               input_ids=tuple(self._ids(_tensors(args))), output_ids=(),
                               has_graph=False, backward_reached=False,
                               grad_bytes_present=present)
            self.forwards.append(call)
            self._root = (module, call)
            self._watch_user_hooks(module)
        finally:
            self.quiet = False

    def _watch_user_hooks(self, model):
        """The outputs of each module of the model with a forward hook of the
        user's (one that stores activations), noted with the hook's line:
        what the hook keeps is named there, not at the forward's line.
        Looked for at every forward: a hook may be registered in the loop.
        Not in a compiled model: a hook of ours would run in compiled code
        (See Note [The doctor beside compiled code])."""
        if id(model) not in self._compiled_models:
            self._compiled_models[id(model)] = bool(compiled_roots(model))
        if self._compiled_models[id(model)]:
            return
        for m in model.modules():
            if not m._forward_hooks or id(m) in self._user_hooked:
                continue
            site = next(filter(None, map(_hook_site, m._forward_hooks.values())), None)
            if site is not None:
                self._user_hooked.add(id(m))
                h = m.register_forward_hook(_ModuleHook(functools.partial(self._hook_output,
                                                                          site)))
                self._undo.append(h.remove)

    def _hook_output(self, site, module, args, output):
        for t in _tensors(output):
            i = _allocation_id(t)
            if i is not None:
                self.hook_outputs.setdefault(i, site)

    def _forward_post(self, module, args, kwargs, output):
        root = self._root
        if root is None or root[0] is not module:
            return
        self._root = None
        call = root[1]
        prev, self.quiet = self.quiet, True
        try:
            call.end_event = len(self.timeline)
            outputs = _tensors(output)
            call.output_ids = tuple(self._ids(outputs))
            nodes = {t.grad_fn for t in outputs if t.grad_fn is not None}
            call.has_graph = bool(nodes)
            call.training = module.training
            call.kv_cache_bytes = kv_cache_bytes(output)
            if call.kv_cache_bytes:
                call.kv_cache_ids = tuple(set(self._ids(_cache_tensors(_cache_of(output)))))
            for node in nodes:
                handle = node.register_prehook(functools.partial(self._backward_reached, call))
                self._undo.append(handle.remove)
            self.last_inputs = self.inputs[call.site] = (module, args, kwargs)
        finally:
            self.quiet = prev

    def _backward_reached(self, call, grad_outputs):
        call.backward_reached = True
        call.backward_events.append(len(self.timeline))

    def _is_model(self, module):
        """Without a model named, the forward of a model is the outermost
        call of a module that has parameters (a loss module has none)."""
        hit = self._has_params.get(module)
        if hit is None:
            hit = self._has_params[module] = next(module.parameters(), None) is not None
        return hit

    def _step_pre(self, optimizer, args, kwargs):
        if self.optimizer is not None and optimizer is not self.optimizer:
            return
        if self.stopping:
            raise StopRun()  # a loop swallowed the last one
        if not any(o is optimizer for o in self._seen_steppers):
            self._seen_steppers.append(optimizer)
        self._step_open = (len(self.timeline), user_frame(1), self.quiet, self._suspend())
        self.quiet = True

    def _step_post(self, optimizer, args, kwargs):
        if self._step_open is None or (self.optimizer is not None
                                       and optimizer is not self.optimizer):
            return
        n0, key, prev, suspended = self._step_open
        self._step_open = None
        self._resume(suspended)
        n1 = len(self.timeline)
        try:
            self.spans.append((n0, n1, key, "optimizer.step", False))
            if not any(o is optimizer for o in self._optimizers):
                self._optimizers.append(optimizer)
            which = next(i for i, o in enumerate(self._optimizers) if o is optimizer)
            self.markers.append((n1, "optimizer_step", which))
            self._new_boundary()
            self._creators = {}
            self.optimizer_steps += 1
            self._forwards_since_step = 0
        finally:
            self.quiet = prev
        if self.max_steps and self.optimizer_steps >= self.max_steps:
            self.stopping = True
            raise StopRun()

    def optimizers_seen(self):
        """The optimizers whose step() began (an OOM may have ended it)."""
        return list(self._seen_steppers)

    def params(self):
        """The parameters whose gradients count: the optimizers', else the
        model's."""
        optimizers = self._optimizers or ([self.optimizer] if self.optimizer is not None else [])
        if optimizers:
            for opt in optimizers:
                for group in opt.param_groups:
                    yield from group["params"]
        elif self.model is not None:
            yield from self.model.parameters()

    def _watch_accumulation(self):
        """Records when backward writes each parameter's gradient: the
        gradients a step keeps are only needed from then on."""
        for p in self.params():
            if id(p) in self._accumulating or not p.requires_grad:
                continue
            self._accumulating.add(id(p))
            handle = p.register_post_accumulate_grad_hook(self._accumulated)
            self._undo.append(handle.remove)

    def _accumulated(self, p):
        g = p.grad
        if g is not None:
            self.accumulations.append((len(self.timeline), id(p), g.numel() * g.element_size()))

    def _zero_grad_wrapper(self, original):
        observer = self

        @functools.wraps(original)
        def zero_grad(this, *args, **kwargs):
            if not observer.quiet and self._counts_zero_grad(this):
                set_to_none = _arg(args, kwargs, 0, "set_to_none", True)
                observer.zero_grads.append((len(observer.timeline), user_frame(1),
                                            bool(set_to_none)))
            prev, observer.quiet = observer.quiet, True
            suspended = self._suspend()
            try:
                return original(this, *args, **kwargs)
            finally:
                self._resume(suspended)
                observer.quiet = prev

        return zero_grad

    def _counts_zero_grad(self, owner):
        if isinstance(owner, torch.optim.Optimizer):
            return self.optimizer is None or owner is self.optimizer
        return self.model is None or owner is self.model

    # -- what calls do -----------------------------------------------------

    @staticmethod
    def _ids(tensors):
        out = []
        for t in tensors:
            i = _allocation_id(t)
            if i is not None:
                out.append(i)
        return out

    def note_call(self, func, args, kwargs, out, n0, n1):
        """A call that allocated or may copy to a device or run out of place:
        its span, float64 tensors, graph inputs and what else it does."""
        key = user_frame(2)
        if isinstance(out, (tuple, list)):
            grad = any(isinstance(t, _Tensor) and t.requires_grad for t in out)
        else:
            grad = isinstance(out, _Tensor) and out.requires_grad
        if n1 != n0:
            self.spans.append((n0, n1, key, func, grad))
            self.note_float64(out, args, n0, key, func)
            if grad:
                self._note_creators(out)
        if grad:
            self.note_graph_inputs(func, args, n0, 3)
        special = _SPECIAL.get(func)
        if special == "copy":
            self._note_copy(func, args, kwargs, out, n0, key)
        elif special == "in_place":
            self._note_in_place(func, args, kwargs, out, n0, key)

    def _note_creators(self, out):
        if len(self._creators) > 1_000_000:  # a loop with no optimizer step
            self._creators = {}
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, _Tensor) and t.grad_fn is not None:
                i = _allocation_id(t)
                if i is not None:
                    self._creators.setdefault(id(t.grad_fn), []).append(i)

    def watch_backward(self, func, args, kwargs):
        """Before a backward that retains its graph (and makes none): a hook
        on each node of the graph notes the event it ran at, when backward
        without retain_graph would have freed what it saved. Returns what
        end_backward takes, or None for any other backward."""
        retain, create = _BACKWARDS[func]
        if (not _arg(args, kwargs, retain, "retain_graph", None)
                or _arg(args, kwargs, create, "create_graph", False)):
            return None
        ran, handles, seen = {}, [], set()
        todo = [t.grad_fn for t in _tensors(args[:1]) if t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if id(node) in self._creators:
                handles.append(node.register_hook(
                    functools.partial(self._node_ran, ran, id(node))))
            todo += [n for n, _ in node.next_functions]
        return ran, handles, user_frame(2)

    def _node_ran(self, ran, node_id, grad_inputs, grad_outputs):
        ran[node_id] = len(self.timeline)

    def end_backward(self, watch, n0, n1):
        ran, handles, key = watch
        for h in handles:
            h.remove()
        released = tuple((i, e) for node_id, e in ran.items()
                         for i in self._creators.get(node_id, ()))
        self.retained.append((n0, n1, key, released))

    def note_graph_inputs(self, func, args, n0, depth):
        """A tensor with a graph from before this step taken by a call whose
        result requires grad (`total += loss`): `depth` frames up is the
        torch call."""
        if not torch.is_grad_enabled():
            return
        for a in args:
            if isinstance(a, (tuple, list)):  # an RNN's (h, c)
                for b in a:
                    if isinstance(b, _Tensor):
                        self._note_graph_input(b, func, n0, depth + 1)
            elif isinstance(a, _Tensor):
                self._note_graph_input(a, func, n0, depth + 1)

    def _note_graph_input(self, a, func, n0, depth):
        if not a.requires_grad or a.is_leaf:
            return
        i = _allocation_id(a)
        if i is not None and self._first_id <= i < self._boundary_id:
            seen = (i, self._boundary_id)
            if seen not in self._seen:
                self._seen.add(seen)
                self.graph_uses.append((i, n0, user_frame(depth), func))

    def note_float64(self, out, args, n0, key, func):
        """float64 tensors of a call that computes in float64: its float64
        results, and its float64 inputs (which may come from outside torch's
        allocator: torch.from_numpy). A call turning float64 into float32
        adds nothing."""
        outs = out if isinstance(out, (tuple, list)) else (out,)
        outs = [t for t in outs if isinstance(t, _Tensor) and t.dtype is torch.float64]
        if not outs:
            return
        for t in outs + [a for a in args if isinstance(a, _Tensor) and a.dtype is torch.float64]:
            self._note_float64(t, n0, key, func)

    def _note_float64(self, t, n0, key, func):
        # Once per tensor and step; a tensor memfit did not allocate is known
        # by its address.
        n = t.numel()
        if n <= 1:
            return
        i = _allocation_id(t)
        seen = (("id", i) if i is not None else ("ptr", t.data_ptr()), self._boundary_id)
        if seen in self._seen:
            return
        self._seen.add(seen)
        self.float64.append((i, n0, key, func, n * t.element_size()))

    def note_host(self, func, args, kwargs, out):
        """`t.cpu()`, `t.to("cpu")`, `t.numpy()` of a tensor already on the
        CPU: its storage is host memory in the GPU run rehearsed (a
        `.detach().cpu()` kept for metrics is not the device's)."""
        t = args[0] if args else None
        if not isinstance(t, _Tensor) or t.device.type != "cpu":
            return
        if func is _Tensor.to and not any(
                isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu"
                for a in (*args[1:], kwargs.get("device"))):
            return  # a dtype's .to() is no move to the host
        i = _allocation_id(out if isinstance(out, _Tensor) else t)
        if i is not None:
            self.host_ids.add(i)

    def note_clone(self, args, out):
        """A clone of a parameter's storage: a copy of the model's weights."""
        t = args[0] if args else None
        if not isinstance(t, _Tensor) or not isinstance(out, _Tensor):
            return
        ptr = t.untyped_storage().data_ptr()
        if any(p.untyped_storage().data_ptr() == ptr for p in self._weights()):
            i = _allocation_id(out)
            if i is not None:
                self.weight_copies.add(i)

    def _weights(self):
        if self.model is not None:
            return self.model.parameters()
        return self.params()

    def note_uses(self, args):
        """Marks pending in-place candidates whose input a call takes."""
        for a in args:
            if isinstance(a, (list, tuple)):
                self.note_uses(a)
            elif isinstance(a, _Tensor):
                hit = self.pending.get(_allocation_id(a))
                if hit is not None:
                    self.candidates[hit[0]][6] = True

    def _note_copy(self, func, args, kwargs, out, n0, key):
        if not args or not isinstance(args[0], _Tensor):
            return
        if func is _Tensor.copy_:
            if len(args) < 2 or not isinstance(args[1], _Tensor):
                return
            dst, src = args[0], args[1]
            non_blocking = _arg(args, kwargs, 2, "non_blocking", False)
        else:
            src, dst = args[0], out
            if not isinstance(dst, _Tensor) or dst is src:
                return
            if func is _Tensor.cuda:
                non_blocking = _arg(args, kwargs, 2, "non_blocking", False)
            else:  # Tensor.to: the first positional bool is non_blocking
                non_blocking = kwargs.get("non_blocking",
                                          next((a for a in args[1:] if isinstance(a, bool)), False))
        if src.device.type != "cpu" or dst.device.type == "cpu":
            return
        self.copies.append((n0, key, src.numel() * src.element_size(), bool(src.is_pinned()),
                            bool(non_blocking), str(dst.device)))

    def _note_in_place(self, func, args, kwargs, out, n0, key):
        name, _fix, pos, check = _IN_PLACE[func]
        if pos is not None and _arg(args, kwargs, pos, "inplace", False):
            return
        if check == "dropout" and (not _arg(args, kwargs, 2, "training", True)
                                   or not _arg(args, kwargs, 1, "p", 0.5)):
            return
        if check == "slope" and _arg(args, kwargs, 1, "negative_slope", 0.01) <= 0:
            return
        if check == "alpha" and _arg(args, kwargs, 1, "alpha", 1.0) < 0:
            return
        if not isinstance(out, _Tensor) or "out" in kwargs:
            return
        if called_from_other_library(2):
            return  # a transformers model's add: not a line the user can change
        inputs = [a for a in args[:2] if isinstance(a, _Tensor)] if check == "add" else args[:1]
        for x in inputs:
            if self._could_overwrite(x, out):
                xid, oid = _allocation_id(x), _allocation_id(out)
                if xid is None or oid is None:
                    return
                module = self._module_running()
                self.candidates.append([xid, oid, n0, key, name, module, False])
                index = len(self.candidates) - 1
                ref = weakref.ref(x, functools.partial(_drop_pending, self.pending, xid))
                self.pending[xid] = (index, ref)
                return

    def _module_running(self):
        """The innermost module whose forward is running: its name in the
        model, or its class."""
        f = sys._getframe(2)
        while f is not None:
            if f.f_code.co_name == "forward":
                owner = f.f_locals.get("self")
                if isinstance(owner, torch.nn.Module):
                    return self._module_names.get(owner) or type(owner).__name__
            f = f.f_back
        return ""

    @staticmethod
    def _could_overwrite(x, out):
        """x is referenced by nothing but itself (no view of its storage; not
        saved by autograd, whose saved copy would share it), is not a leaf
        that requires grad, and has the result's shape, dtype and device."""
        if not isinstance(x, _Tensor) or x is out:
            return False
        if x.requires_grad and x.is_leaf:
            return False
        if x.shape != out.shape or x.dtype != out.dtype or x.device != out.device:
            return False
        if x._is_view() or x.device.type not in ("cpu", "meta"):
            return False
        # Two owners: x itself and the storage object made for this call.
        return torch._C._storage_Use_Count(x.untyped_storage()._cdata) == 2



def _drop_pending(pending, xid, _ref):
    pending.pop(xid, None)
