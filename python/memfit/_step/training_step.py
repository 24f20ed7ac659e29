"""The training step's plain parts, shared by profile, fit, the Trainer,
advise and the strategies: calling the model on a batch, the loss, the
built-in optimizers by name, and the checks made before anything runs."""

import inspect
import itertools
import sys
from collections.abc import Mapping

import torch

from .._native import native as _native
from .batching import tensors_in
from .offload import OffloadedOptimizer
from .optimizer_chain import OptimizerChain

__all__: list = []



def _builder(spec):
    """A function of the parameters that builds the built-in `spec`."""
    cls = getattr(torch.optim, spec.torch_class)
    options = {"lr": spec.lr, **({"momentum": spec.momentum} if spec.momentum else {})}

    def build(params):
        optimizer = cls(params, **options)
        return OffloadedOptimizer(optimizer) if spec.on_host else optimizer

    return build


# The core's built-in optimizers (core/model/optimizers.h) as torch.optim
# optimizers, by name: the one place Python builds them. "none" has no class:
# Python says None.
OPTIMIZERS = {s.name: _builder(s) for s in _native.builtin_optimizers() if s.torch_class}


def builtin_name(optimizer):
    """The built-in name of a torch.optim optimizer built as one of OPTIMIZERS
    builds it (its class and whether it has momentum; the learning rate
    aside), else None."""
    momentum = bool(optimizer.defaults.get("momentum", 0))
    for s in _native.builtin_optimizers():
        if s.torch_class and not s.on_host and bool(s.momentum) == momentum:
            if type(optimizer) is getattr(torch.optim, s.torch_class):
                return s.name
    return None

def default_loss(output, target, what="profile"):
    if target is None:
        if output.dim() != 0:
            raise ValueError(
                f"[{what}] the model returned a tensor of shape {tuple(output.shape)} "
                f"and there is no target or loss_fn: pass loss_fn=, or a target"
            )
        return output
    if target.dtype in (torch.int64, torch.int32, torch.int16, torch.uint8):
        return torch.nn.functional.cross_entropy(output, target)
    return torch.nn.functional.mse_loss(output, target)


def compute_loss(output, target, loss_fn, what="profile"):
    """loss_fn(output, target), or the default loss; raises ValueError, one
    line tagged `what` (the operation the user called), for an output no loss
    can take (None, or a dict or tuple without loss_fn) and for a loss that
    is not a scalar tensor. A model's output that carries its own loss
    (Hugging Face's) is _step.user_step's to read."""
    if output is None:
        raise ValueError(
            f"[{what}] the model returned None: its forward must return its output "
            f"(a missing `return`?)"
        )
    if loss_fn is None:
        if not isinstance(output, torch.Tensor):
            raise ValueError(
                f"[{what}] the model returned a {type(output).__name__}, not a "
                f"tensor: pass loss_fn= taking (output, target) and returning "
                f"a scalar tensor"
            )
        loss = default_loss(output, target, what)
    else:
        try:
            loss = (loss_fn(output, target) if target is not None or _needs_two(loss_fn)
                    else loss_fn(output))
        except (TypeError, AttributeError) as e:
            if isinstance(output, torch.Tensor):
                raise
            raise ValueError(
                f"[{what}] loss_fn failed on the model's output, a {type(output).__name__} "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}): make "
                f"loss_fn take that output, or return a tensor from the model"
            ) from e
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(
            f"[{what}] the loss must be a scalar tensor, got {shape}: reduce it "
            f"(e.g. .mean()) in loss_fn"
        )
    return loss


def _needs_two(loss_fn):
    """Whether loss_fn requires two positional arguments: without a target
    it gets (output, None), as written for `loss_fn(output, target)` (a
    `lambda out, _: out.loss` raised "missing 1 required positional
    argument"); one that takes the output alone gets it alone."""
    try:
        params = inspect.signature(loss_fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in positional and p.default is p.empty for p in params) >= 2


def call_model(model, inputs):
    try:
        if isinstance(inputs, (tuple, list)):  # positional arguments, as documented
            return model(*inputs)
        if isinstance(inputs, Mapping):  # a dict, or a BatchEncoding: keyword arguments
            return model(**inputs)
        return model(inputs)
    except Exception as e:
        _note_the_models_error(e, inputs)
        raise


def _note_the_models_error(error, inputs):
    """An error the model's own forward raised (a shape it does not take, a
    dtype) reached the user through memfit's frames, as if memfit broke:
    a note names what the forward was called with. Not on an out-of-memory
    error (the search's own signal) nor one already noted (a nested call)."""
    notes = getattr(error, "__notes__", ())
    if (not hasattr(error, "add_note") or isinstance(error, torch.cuda.OutOfMemoryError)
            or any(n.startswith("memfit:") for n in notes)):
        return
    leaves = tensors_in(inputs)
    shown = ", ".join(f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')} on {t.device}"
                      for t in leaves[:4]) + (", ..." if len(leaves) > 4 else "")
    error.add_note(f"memfit: raised by the model's own forward, called with tensors {shown}")


def check_loss_trains(loss, model, what):
    """Raise ValueError, naming the cause, when `loss` has no gradient to
    take: a training step needs a backward."""
    if loss.requires_grad:
        return
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            f"[{what}] every parameter of the model is frozen (requires_grad=False): there "
            f"is no training step to run; unfreeze the parameters to train "
            f"(p.requires_grad_(True))"
        )
    raise ValueError(
        f"[{what}] the loss does not require grad although the model has trainable "
        f"parameters: the forward or loss_fn runs under torch.no_grad()/inference_mode or "
        f"detaches its result (a step function returns the loss with its graph: memfit runs "
        f"backward and the optimizer); compute the loss with gradients enabled"
    )


def check_model(model, what):
    """Raise ValueError, naming the fix, unless `model` is an nn.Module (a
    compiled one included): torch.compile of a function, or of a model
    compiled already, is a function. A lazy module not yet run (LazyLinear)
    has no sizes to measure: refused, naming it."""
    if isinstance(model, torch.nn.Module):
        lazy = next((name for name, t in itertools.chain(model.named_parameters(),
                                                          model.named_buffers())
                     if torch.nn.parameter.is_lazy(t)), None)
        if lazy is not None:
            raise ValueError(
                f"[{what}] the model's {lazy} is not initialized yet (a lazy module, as "
                f"LazyLinear, gets its size at its first forward): run model(example) once "
                f"first, then make the optimizer over model.parameters()")
        _check_not_sharded(model, what)
        return
    orig = getattr(model, "_torchdynamo_orig_callable", None)
    if orig is not None:
        name = getattr(orig, "__qualname__", type(orig).__name__)
        if name.endswith(".forward"):
            raise ValueError(
                f"[{what}] model is torch.compile of {name}, a model compiled twice "
                f"(torch.compile of a compiled model is a function, not a module): compile it "
                f"once, torch.compile(model)")
        raise ValueError(
            f"[{what}] model is a compiled function, torch.compile({name}), not an nn.Module: "
            f"pass the module (compiled or not) as model, and a function that runs the step "
            f"as step=")
    raise ValueError(f"[{what}] model must be a torch.nn.Module, got {type(model).__name__}")


# Note [Sharded models are refused]
# A model sharded by fully_shard (FSDP2) or tensor parallelism holds
# DTensor parameters, and its forward and backward gather and scatter them
# across the ranks: a collective in every step. memfit's probes and
# verifying steps run as many steps as each rank's search takes, so the
# ranks' collectives would not pair up (a hang until the process group's
# timeout), and the rehearsal's copies of the weights are not DTensors
# (before: an AttributeError from deep inside, "'DeviceMesh' object has no
# attribute 'device'"). torch's FullyShardedDataParallel (FSDP1) wraps the
# same way. So each is refused in one line before anything runs; one
# rank's memory under FSDP2 is planned from the model before sharding
# (memfit.profile(...).data_parallel(world_size, sharding="fsdp2")).


def _check_not_sharded(model, what):
    """Raises ValueError for a model memfit cannot run a step of on one rank
    alone: See Note [Sharded models are refused]."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    wrapper = getattr(fsdp, "FullyShardedDataParallel", None)
    if wrapper is not None and any(isinstance(m, wrapper) for m in model.modules()):
        raise ValueError(
            f"[{what}] the model is wrapped in FullyShardedDataParallel, whose steps gather "
            f"and scatter the weights across ranks, which memfit's probes cannot run on one rank "
            f"alone: pass the model before wrapping, and see one rank's share with "
            f"memfit.profile(...).data_parallel(world_size, sharding='zero3')")
    dtensor = [getattr(sys.modules.get(name), "DTensor", None)
               for name in ("torch.distributed.tensor", "torch.distributed._tensor")]
    dtensor = tuple(t for t in dtensor if isinstance(t, type))
    name = next((n for n, p in model.named_parameters() if isinstance(p, dtensor)),
                None) if dtensor else None
    if name is not None:
        raise ValueError(
            f"[{what}] the model's parameter {name} is a DTensor (fully_shard, FSDP2, or tensor "
            f"parallelism): its steps gather and scatter weights across ranks, which memfit's "
            f"probes cannot run on one rank alone; pass the model before sharding, and see one "
            f"rank's share with memfit.profile(...).data_parallel(world_size, sharding='fsdp2', "
            f"model=model)")


def check_optimizer(model, optimizer, what, instance_only=False):
    """Raise ValueError, naming the fix, unless `model` is a module
    (check_model) and `optimizer` can take the step of `model`: None (no
    optimizer step) or a built-in name, unless `instance_only`; a
    torch.optim optimizer holding some of the model's trainable parameters.
    Called before anything runs."""
    check_model(model, what)
    if instance_only and (optimizer is None or isinstance(optimizer, str)):
        raise ValueError(
            f"[{what}] optimizer must be a torch.optim optimizer over model.parameters(), "
            f"got {optimizer!r}: the step ends with its step(); make one, e.g. "
            f"torch.optim.Adam(model.parameters())"
        )
    if optimizer is None:
        return
    if isinstance(optimizer, str):
        if optimizer not in OPTIMIZERS:
            raise ValueError(
                f"[{what}] unknown optimizer {optimizer!r}: pass a torch.optim "
                f"optimizer, or one of {sorted(OPTIMIZERS)}, or None"
            )
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        if isinstance(optimizer, (list, tuple)) and optimizer and all(
                isinstance(o, torch.optim.Optimizer) for o in optimizer):
            raise ValueError(
                f"[{what}] optimizer is a {type(optimizer).__name__} of {len(optimizer)} "
                f"optimizers: {what} makes other optimizers of the kind given, so it takes "
                f"one; pass one over all their parameters that keeps as much state "
                f"(torch.optim.AdamW(model.parameters()) keeps two buffers a parameter, as "
                f"much as SGD with momentum, Adam or Muon); profile, find_batch_size and "
                f"the Trainer take the list")
        if isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
            raise ValueError(
                f"[{what}] optimizer is a {type(optimizer).__name__}, a learning-rate "
                f"scheduler, not an optimizer: pass the optimizer it drives "
                f"(scheduler.optimizer); the scheduler's step() stays yours to call"
            )
        if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
            torch_own = optimizer.__module__.startswith("torch.optim")
            make = f"{'torch.optim.' if torch_own else ''}{optimizer.__name__}(model.parameters())"
            raise ValueError(f"[{what}] optimizer is the class {optimizer.__name__}, not an "
                             f"optimizer: make one over the model's parameters, {make}")
        raise ValueError(
            f"[{what}] optimizer must be a torch.optim optimizer"
            f"{'' if instance_only else ', one of ' + str(sorted(OPTIMIZERS)) + ', or None'}, "
            f"got {type(optimizer).__name__}"
        )
    if _needs_closure(optimizer):
        raise ValueError(_closure_refusal(optimizer, what))
    trainable = [p for p in model.parameters() if p.requires_grad]
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    if trainable and not any(id(p) in held for p in trainable):
        raise ValueError(
            f"[{what}] the {type(optimizer).__name__} optimizer holds none of the model's "
            f"{len(trainable)} trainable parameters: it was made over other parameters "
            f"(another model, or a copy of this one); make it over model.parameters()"
        )


def _closure_refusal(optimizer, what):
    return (f"[{what}] {type(optimizer).__name__}.step() needs a closure (it evaluates the "
            f"loss again itself): memfit's step ends with optimizer.step() after one "
            f"backward, as a first-order optimizer's loop does; pass a first-order "
            f"optimizer such as torch.optim.Adam, or none (optimizer=None)")


def step_without_closure(optimizer, what):
    """optimizer.step(), as memfit's step ends; one whose closure parameter
    is optional but which needs it all the same (SAM asserts it: an
    AssertionError from inside the rehearsal) is refused as check_optimizer
    refuses LBFGS."""
    try:
        optimizer.step()
    except (AssertionError, TypeError, ValueError, RuntimeError) as e:
        if isinstance(e, torch.cuda.OutOfMemoryError) or "closure" not in str(e).lower():
            raise
        raise ValueError(_closure_refusal(optimizer, what)) from None


def _needs_closure(optimizer):
    """Whether optimizer.step() cannot run without a closure (LBFGS)."""
    try:
        closure = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return closure is not None and closure.default is inspect.Parameter.empty


def optimizer_name(optimizer):
    if optimizer is None:
        return "none"
    if isinstance(optimizer, str):
        return optimizer
    if isinstance(optimizer, OffloadedOptimizer):
        return type(optimizer.inner).__name__ + _native.OFFLOAD_SUFFIX
    if isinstance(optimizer, OptimizerChain):
        return optimizer.name
    return type(optimizer).__name__
