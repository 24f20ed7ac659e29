"""Recording the user's training step on the side: the step's iterations
run under a Tracking recorder, on copies of the weights, inputs and
optimizer state, and the user's model, gradients and optimizer are put back
as they were."""

import dataclasses
import time
import traceback

import torch

from .._native import native as _memfit
from .callable_state import CallableState, users_step_functions
from .compiled import (CompileCost, compiler_unavailable, eager_stance, inductor_error,
                       is_compiled, record_warm)
from .frameworks import fabric_backward_refusal
from .meta_reads import run_foreach
from .loop import Loop, train_mode
from .offload import OffloadedOptimizer
from .optimizer_chain import state_values
from .progress import as_progress
from .step_flops import open_count
from .tracking import Tracking
from .training_step import OPTIMIZERS, check_loss_trains, step_without_closure
from .user_step import StepError, as_user_step
from .user_state import (ModelTensors, OptimizerState, model_modules, optimizer_states,
                         optimizer_tree, private_copy, with_loss_module)

__all__: list = []


@dataclasses.dataclass
class RecordedStep:
    """One recorded step: its recorder, whether a named optimizer ran
    foreach (as on CUDA parameters), the bytes an offloaded optimizer
    kept on the host, out of the recording, and for a compiled model what
    compiling cost on the way (a CompileCost; None for an eager model)."""

    tracking: Tracking
    ran_foreach: bool
    host_bytes: int
    compile: CompileCost | None = None
    # Wall time of the forward and of the backward phases, all iterations:
    # what a compiled model's warm-up runs besides compiling.
    forward_seconds: float = 0.0
    backward_seconds: float = 0.0
    # For a card (as_on_cuda): each convolution forward's and backward's
    # cuDNN workspace bound, in the order of its mark in the timeline.
    conv_workspaces: list = dataclasses.field(default_factory=list)
    # What dropping the kept model output frees (Loop.keep_output; 0 when
    # the loop drops it, or a step function's forward is its loss): what a
    # loop that drops it once the loss exists holds less.
    output_bytes: int = 0


    @property
    def timeline(self):
        return self.tracking.timeline


# Note [A rehearsal inside the user's autocast]
# A step profiled inside torch.autocast (memfit.Trainer plans its micro-batch
# inside the user's autocast region) shares autocast's cache of the weights'
# casts, which lives until the outermost autocast region exits: keyed by the
# Parameter, it would hand the rehearsal casts made before it (and not
# measure them: the Trainer's first plan came out a micro-batch too large,
# by the bf16 copy of the weights, and step 2 recovered an OOM), and hand
# the user's next forward casts of the rehearsal's copies (of meta tensors,
# in meta mode). So the cache is cleared before the rehearsal, which then
# measures its own casts as a step of its own would, and after it: the
# user's next forward casts the weights again, the values it would have
# had.
def _autocast_on():
    return any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda"))


def rehearse(model, inputs, target, loss_fn, optimizer, iterations, device, loop=Loop(),
             say=None, as_on_cuda=False, eager=False, counters=None):
    """record_step on copies of the weights, inputs, .grad and optimizer
    state, as the user's next step starts with them (See Note [State the
    step starts with]), in `loop`'s order and with the model in train mode
    unless loop.train_mode is False; the model, its gradients and modes and
    the optimizer are put back as they were. A compiled model's step is
    recorded warm (See Note [Recording a compiled step]); eager=True records
    its eager step instead. counters: told of each phase as it begins
    and ends (phase(name, iteration), end_phase()), to read a card's own
    counters there (report/places.py)."""
    held = with_loss_module(model, loss_fn)  # a loss module's weights are the step's too
    if counters is not None:
        counters.begin(held, optimizer)
    saved = ModelTensors(held, optimizer, held=True)
    opt_state = OptimizerState(optimizer) if isinstance(optimizer, torch.optim.Optimizer) else None
    # See Note [What the user's functions keep] (callable_state.py).
    functions = CallableState(users_step_functions(loss_fn, optimizer_tree(optimizer),
                                                   model_modules(held)))
    autocast = _autocast_on()
    if autocast:  # See Note [A rehearsal inside the user's autocast].
        torch.clear_autocast_cache()

    def record(warm_up=None):
        if counters is not None:  # a compiled model's warm-up records first
            counters.restart()
        return record_step(model, saved, inputs, target, loss_fn, optimizer, iterations, device,
                           loop, say, as_on_cuda, warm_up, counters)

    def reset():  # what a recording that was thrown away left
        for p in saved.parameters:
            p.grad = None
        saved.reset_optimizer_state()

    try:
        with train_mode(model, loop.train_mode):
            # A compiled step function compiles as a compiled model does.
            compiled_step = hasattr(getattr(loss_fn, "step", None), "_torchdynamo_orig_callable")
            if not (is_compiled(model) or compiled_step):
                return record()
            return _record_compiled(model, record, reset, device, eager, iterations)
    except BaseException as e:
        # See Note [A rehearsal that runs out of memory puts everything back].
        traceback.clear_frames(e.__traceback__)
        raise
    finally:
        if autocast:
            torch.clear_autocast_cache()
        try:
            saved.restore()  # drops the rehearsal's .grad and state first
        finally:
            functions.restore()
            if opt_state is not None:
                opt_state.restore()


# Note [A rehearsal that runs out of memory puts everything back]
# Putting the weights back allocates them on the device again (their values
# waited on the host, see ModelTensors), one at a time. A rehearsal that ran
# out of memory on a simulated device left it nearly full: its activations
# held by the exception's frames, its gradients, its optimizer state. The
# first weight put back then ran out of memory too, and the optimizer's state
# was never put back (a Trainer's plan that failed left Adam's state from its
# probes on the user's optimizer). So the rehearsal's own memory is dropped
# first (the frames' locals, .grad, the optimizer's state: each held tensor
# gets its values back in place of the rehearsal's copy), and the
# optimizer's hyperparameters are put back even if the weights could not be.


class _StepState:
    """What one recorded iteration holds, dropped in the order its locals
    used to go (x, y, out, loss) when the iteration ends: the callbacks of
    _record_step keep no tensor alive longer than the step itself would."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.x = self.y = self.out = self.loss = None
        self.losses = None  # a step's losses, each backward in turn
        self.held = None  # batches a framework's loop holds beside the step's

    def drop(self, keep_output=False):
        """keep_output: the output stays until the next forward replaces
        it, as the user's `pred = model(X)` does (Loop.keep_output)."""
        self.held = None
        self.x = None
        self.y = None
        if not keep_output:
            self.out = None
        self.loss = None
        self.losses = None


def _record_compiled(model, record, reset, device, eager, iterations):
    """The recording of a compiled model's step: warm, or eager where it
    cannot compile (the meta device, no C++ compiler for inductor), the
    CompileCost saying which."""
    t0 = time.perf_counter()
    why = ("eager step asked for (compare_eager)" if eager
           else "recorded the eager step on the meta device (inductor does not compile for "
                "meta tensors); compiled may differ" if device.type == "meta"
           else compiler_unavailable(model))
    # Looking for the C++ compiler (once a process) is what inductor's first
    # compile would do: counted as compiling.
    search_s = time.perf_counter() - t0
    if why is None:
        try:
            rec, cost, warm = record_warm(model, record, reset, iterations)
            if cost.compiled:
                cost.seconds += search_s
            cost.recorded_warm = warm
            rec.compile = cost
            return rec
        except Exception as e:  # noqa: BLE001 - only inductor's toolchain errors are handled
            why = inductor_error(e)
            if why is None:
                raise
            traceback.clear_frames(e.__traceback__)
        reset()
    with eager_stance():
        rec = record()
    rec.compile = CompileCost(ran_eager=why)
    return rec


# Note [What a kept output holds]
# What a loop that keeps the model's output holds more than one that drops
# it once the loss exists is not the output's own bytes: a view such as
# logits[:, -1] keeps its base's storage (99.6 KiB said where 3.1 MiB stayed
# alive), and an output the loss did not use keeps its graph, which backward
# never freed (a projection's input beside it: half of what stayed). So the
# figure is what dropping the last iteration's output frees, read after the
# recording stopped: the timeline is the loop's, output kept. It is what
# stays alive into the next forward; a loop dropping the output saves up to
# it at the peak, less where the loss's backward holds part anyway (features
# the loss reads: 69 KiB of 1.8 MiB).
def _freed_by_dropping(step, device):
    """The bytes that go when `step`'s output is dropped."""
    def live():
        if device.type == "cuda":
            return torch.cuda.memory_allocated(device)
        return _memfit.tracked_live_bytes("meta" if device.type == "meta" else "cpu")
    before = live()
    step.out = None
    return max(0, before - live())


def record_step(model, saved, inputs, target, loss_fn, optimizer, iterations, device,
                loop=Loop(), say=None, as_on_cuda=False, warm_up=None, counters=None):
    """Runs `iterations` optimizer steps of `loop`'s shape (See Note [The
    loop the user runs], step_protocol.h) under a recorder; returns a
    RecordedStep. loop.set_to_none=False zeroes the gradients in place: they
    stay alive through the next iteration's forward. Either way the
    rehearsal's gradients are dropped when `saved` is restored: the user's
    .grad come back. as_on_cuda: an
    optimizer named by a string runs foreach, as on CUDA parameters (See
    Note [The optimizer a GPU would run]). warm_up: one iteration without
    the optimizer's step, to compile a compiled model (See Note [Recording
    a compiled step]): "backward" runs its forward, loss and backward,
    "forward" its forward and loss only (the backward compiled with the
    forward), None records the step."""
    how = as_user_step(loss_fn)  # See Note [The step function's contract].
    if warm_up:
        iterations, optimizer, loop = 1, None, Loop()
    t = Tracking()
    ran_foreach = False  # a named optimizer set to foreach (as_on_cuda)
    if device.type == "meta":
        # The device's bytes only: what stays on the host (AdamW's step
        # counts) would stay on the host beside a GPU too.
        t.only_device("meta")
        # See Note [Meta kernels allocate only their outputs] (op_frames.h).
        t.drop_meta_kernel_intermediates()
    if as_on_cuda:  # See Note [What a card adds inside an op] (card_ops.h).
        t.add_card_kernels()
    t.watch_modules(model, classes=True)
    step = _StepState(optimizer)
    flops = open_count()  # See Note [FLOPs counted while a step is recorded].

    def materialize():
        nonlocal ran_foreach
        saved.swap_in_copies(device, t.classify)
        if isinstance(step.optimizer, str):
            step.optimizer = OPTIMIZERS[step.optimizer](saved.parameters)
            if as_on_cuda:  # memfit's own optimizer: nothing to put back
                ran_foreach = bool(run_foreach(step.optimizer))

    def inputs_():
        if flops is not None:
            flops.iteration()
        step.x = private_copy(inputs, device)
        step.y = None if target is None else private_copy(target, device)
        step.held = [private_copy(inputs, device) for _ in range(how.held_batches)]

    timed = [0.0, 0.0]  # forward, backward
    has_output = [False]  # an output beside the loss (a step function's forward is its loss)

    def forward():
        if flops is not None:
            flops.forward_begins()
        t0 = time.perf_counter()
        step.out = how.forward(model, step.x)
        timed[0] += time.perf_counter() - t0

    def backward():
        if warm_up == "forward":
            step.loss = None  # drops the graph: its backward was compiled with the forward
            return
        if flops is not None:
            flops.backward_begins()
        t0 = time.perf_counter()
        try:
            # See Note [A step of several backwards] (user_step.py).
            for part in (step.losses or [])[:-1]:
                part.backward(retain_graph=True)
            (step.losses[-1] if step.losses else step.loss).backward()
        except RuntimeError as e:
            refusal = fabric_backward_refusal(e, how.what)
            if refusal is None:
                raise
            raise StepError(refusal) from None
        timed[1] += time.perf_counter() - t0
        if flops is not None:
            flops.step_begins()

    def loss():
        step.loss = how.loss(step.out, step.y)
        step.losses = how.losses(step.out)
        check_loss_trains(step.loss, model, how.what)
        has_output[0] = step.out is not step.loss and step.losses is None
        if not loop.keep_output:  # See Note [The order of a training iteration] (report.h).
            step.out = None

    def optimizer_step():
        step_without_closure(step.optimizer, how.what)
        for states in optimizer_states(step.optimizer):  # a wrapper's base optimizer's too
            for v in (v for state in states.values() for v in state_values(state)):
                if isinstance(v, torch.Tensor):
                    t.classify(v, "optimizer_state")

    def zero_grad():
        (model if step.optimizer is None else step.optimizer).zero_grad(
            set_to_none=loop.set_to_none)

    def begin_phase(name, iteration):
        if counters is not None:
            counters.phase(name, iteration)
        t.phase(name, iteration)

    def end_phase():
        t.end_phase()
        if counters is not None:
            counters.end_phase()
        step.drop(loop.keep_output)

    if flops is not None:
        flops.start(model)
    try:
        callbacks = _memfit.StepCallbacks(
            begin_phase=begin_phase, materialize=materialize, inputs=inputs_, forward=forward,
            loss=loss, end_phase=end_phase, backward=backward,
            optimizer_step=None if optimizer is None else optimizer_step, zero_grad=zero_grad)
        _memfit.run_step_protocol(callbacks, iterations=iterations,
                                  progress=as_progress(say).native,
                                  what=f"record on {device.type}",
                                  accumulation_steps=loop.accumulation_steps,
                                  zero_grad_first=loop.zero_grad_first)
    finally:
        if flops is not None:
            flops.stop()
        conv_workspaces = t.take_conv_workspaces() if as_on_cuda else []
        t.stop()
    # See Note [What a kept output holds]; a dropped output costs nothing more.
    output_bytes = _freed_by_dropping(step, device) if loop.keep_output and has_output[0] else 0
    optimizer = step.optimizer
    # Kept on the host, out of the recording: said in the report's notes.
    host_bytes = optimizer.host_bytes() if isinstance(optimizer, OffloadedOptimizer) else 0
    return RecordedStep(t, ran_foreach, host_bytes, output_bytes=output_bytes,
                        forward_seconds=timed[0],
                        backward_seconds=timed[1],
                        conv_workspaces=conv_workspaces)
