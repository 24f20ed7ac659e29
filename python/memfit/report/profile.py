"""memfit.profile: where a training step's memory goes, and what a bigger
batch would need."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Callable

import torch

from .._native import native as _memfit
from .._step.batching import (batch_size, check_samples, count, resize_batch,
                              target_batch_dim_of, tensors_in)
from .._step.device import host_memory, to_bytes
from .._step.frameworks import unwrapped_optimizer
from .._step.hints import Batch, LossFn, OptimizerArg, ProgressArg, Size, StepFn
from .._step.compiled import CompileCost, compiled_paths
from .compiled import CompiledRecordings
from .length_surface import LengthAxis, LengthPrediction, LengthSurface, with_length_axis
from .._step.loop import as_loop, eval_modules, kept_output_note
from .._step.meta_checked import CHECK_TOLERANCE, checked_note, cpu_kernels_note, is_checked
from .._step.meta_reads import MetaReads, foreach_as_on_cuda
from .._step.meta_rnn import (HEADROOM, free_host_bytes, host_bytes_at, on_cpu_note,
                               peak_bytes, rnn_modules, unsized_note)
from .._step.progress import as_progress
from .._step.record import rehearse
from .._step.training_step import check_optimizer, optimizer_name
from .._step.user_step import as_user_step
from .._step.user_state import KernelSwitches, kept_rng, no_user_post_hooks, step_tensors
from . import data_parallel as _dp
from . import page as report_page
from .places import place_of
from .probing import Probing
from .step_growth import growth_note
from .value_sized import profile_note
from .workspace_note import workspace_note

__all__ = ["DEFAULT_CUDA_WORKSPACE", "Report", "profile"]

# cuBLAS workspace on most GPUs (8 MiB + 128 KiB); 32 MiB on Hopper.
DEFAULT_CUDA_WORKSPACE = _memfit.DEFAULT_CUDA_WORKSPACE


class Report:
    """One profiled step: phases, categories at the peak, modules, timeline."""

    # profile(..., seq_dim=): the same step at other (batch, length) shapes.
    length_axis: LengthAxis | None = None

    def __init__(self, native: _memfit.Report, timeline: _memfit.Timeline,
                 model_sizes: tuple = ((), 0), record_at: Callable | None = None,
                 compiled: Any = None, loop_notes: tuple = (),
                 value_sized_ops: tuple = (), output_per_sample: float = 0.0,
                 output_kept: bool = True) -> None:
        self._native = native
        self.loop_notes = list(loop_notes)  # the loop's and the held state's notes
        # The model's output a sample, and whether the step kept it until the
        # next forward (profile's keep_output): See Note [The order of a
        # training iteration] (report.h).
        self.output_per_sample = output_per_sample
        self.output_kept = output_kept
        # The ops of the step that size their output by the batch's values:
        # See Note [Memory that depends on the batch's values] (op_frames.h).
        self.value_sized_ops = list(value_sized_ops)
        self.timeline = timeline
        self._record_at = record_at
        self._probed = None  # see prediction()
        self._trainable_sizes, self._largest_unit_bytes = model_sizes
        self._compiled = compiled  # a _Compiled for a compiled model, else None

    @property
    def compile(self) -> CompileCost | None:
        """For a compiled model, what compiling cost on the way to this
        step's recording, counted apart from its bytes (a CompileCost:
        seconds, host_peak_bytes, graphs, graph_breaks, recompiles,
        ran_eager, line()); None for an eager model."""
        return None if self._compiled is None else self._compiled.costs.get(self.batch)

    @property
    def compile_log(self) -> list:
        """For a compiled model, (batch, CompileCost) of every step this
        report recorded, probes and verifications included, in order: a
        recording that compiled (a recompile at a new batch) shows here."""
        return [] if self._compiled is None else list(self._compiled.log)

    @property
    def eager_peak_bytes(self) -> int | None:
        """For a compiled model profiled with compare_eager=True (or after
        compare_eager()), the peak of the same step run eagerly."""
        return None if self._compiled is None else self._compiled.eager_peak

    def compare_eager(self) -> str:
        """For a compiled model: "compiling saves 224 MiB (33%) of this
        step's peak" (or "costs"), from this step and the eager step, both
        recorded; the eager step is recorded on first use."""
        if self._compiled is None:
            raise ValueError("[compare_eager] the model is not compiled (torch.compile): there "
                             "is no eager step to compare with")
        return self._compiled.comparison(self)

    @property
    def optimizer(self) -> str:
        """The optimizer the step ran ("adam", "sgd", "none", ...)."""
        return self._native.optimizer

    @property
    def peak_bytes(self) -> int:
        """The most bytes alive at once during the step."""
        return self._native.peak_bytes

    @property
    def peak_phase(self) -> str:
        """The phase the peak fell in ("forward", "backward", ...)."""
        return self._native.peak_phase

    @property
    def peak_iteration(self) -> int:
        """The iteration the peak fell in (1 = the first)."""
        return self._native.peak_iteration

    @property
    def mode(self) -> str:
        """Where the step was recorded: "device" (on the device the model is
        on: a card, or the simulated device), "cpu" or "meta" (rehearsed);
        truth says it in words."""
        return self._native.mode

    @property
    def batch(self) -> int:
        """The batch size the step ran with."""
        return self._native.batch

    @property
    def parameter_bytes(self) -> int:
        """The bytes of the model's parameters."""
        return self._native.parameter_bytes

    @property
    def categories_at_peak(self) -> dict:
        """Bytes by category (parameter, activation, ...) at the peak."""
        return self._native.categories_at_peak

    @property
    def modules(self) -> list:
        """The modules that held the most bytes at the peak."""
        return self._native.modules

    @property
    def notes(self) -> list[str]:
        """What the report is unsure of or left out, one line each."""
        return self._native.notes

    @property
    def cuda(self) -> Any:
        """target_device="cuda": the caching allocator's view (peak_allocated,
        peak_reserved, workspace_bytes); else None."""
        return self._native.cuda

    @property
    def budget_peak_bytes(self) -> int:
        """The peak a budget is held against: cuda.peak_reserved for a CUDA
        target, else peak_bytes."""
        return self._native.budget_peak()

    @property
    def phases(self) -> list[dict]:
        """Per phase and iteration: name, iteration, live_bytes_after,
        delta_bytes, peak_bytes, note."""
        return [p.as_dict() for p in self._native.phases]

    @property
    def truth(self) -> str:
        """Where the figures were measured, in words: "measured on cuda:0
        (NVIDIA H200) ...", "measured on the simulated device (8.00 MiB
        budget)", "rehearsed on the CPU for a CUDA card". See Note
        [Measured on the device] (places.py)."""
        return self._native.truth

    def table(self, max_modules: int = 10) -> str:
        """The report as a text table; its second line says where it was
        measured."""
        return self._native.table(max_modules)

    def to_json(self, pretty: bool = True) -> str:
        """The report as JSON (keys as `memfit profile --json`; a compiled
        model's adds "compile": what compiling cost, and "eager_peak_bytes"
        once compared)."""
        text = self._native.to_json(pretty)
        if self._compiled is None:
            return text
        d = json.loads(text)
        d["compile"] = self.compile.to_dict() if self.compile is not None else None
        d["compile_log"] = [{"batch": b, **c.to_dict()} for b, c in self.compile_log]
        if self.eager_peak_bytes is not None:
            d["eager_peak_bytes"] = self.eager_peak_bytes
        return json.dumps(d, indent=2 if pretty else None)

    def save_html(self, path: str, title: str | None = None, budget: Size | None = None,
                  advice: Any = None, x_axis: str = "time", predict: bool = True) -> str:
        """Write one self-contained HTML page of this report to `path`: memory by
        category over time and activations by module (hover for exact bytes), the
        tables, the notes, the peak over batch sizes with the `budget` line, and
        `advice` (a memfit.advise() result) as the advise table. predict=True runs
        the probes of prediction() (peak_model()). Returns `path`."""
        return report_page.save_html(self, path, title=title, budget=budget, advice=advice,
                                     x_axis=x_axis, predict=predict)

    def save_svg(self, path: str, title: str | None = None) -> None:
        """Write the memory timeline as an SVG to `path`."""
        with open(path, "w") as f:
            f.write(self.timeline.svg(title or f"memfit profile: {self._native.model}"))

    def peak_model(self, batch: int | None = None) -> _memfit.PeakModel:
        """The fitted peak-vs-batch model (a PeakModel) behind prediction(batch):
        the same probes, grown toward `batch` (default: this report's batch),
        run on first use and kept. A batch the model cannot be trusted at
        (below its probes, or where it is not affine) prediction() measures
        itself (See Note [Probes past a step's odd small batches])."""
        batch = self.batch if batch is None else count(batch, "peak_model", "batch")
        return self._probe_toward(batch, grown=True).model

    @property
    def native(self) -> _memfit.Report:
        """The C++ report, for memfit's planners."""
        return self._native

    def at_batch(self, batch: int) -> Report:
        """The same step recorded at `batch` samples (the example batch cut
        or repeated: its shapes, the example's values), as a Report."""
        if self._record_at is None:
            raise ValueError("[at_batch] this report cannot record other batches")
        native, timeline = self._record_at(count(batch, "at_batch", "batch"))
        return Report(native, timeline, (self._trainable_sizes, self._largest_unit_bytes),
                      self._record_at, self._compiled, self.loop_notes, self.value_sized_ops,
                      self.output_per_sample, self.output_kept)

    @property
    def samples(self) -> int:
        """The real samples other batches are cut from or repeated: the
        example's, or those of from_samples."""
        return getattr(self._record_at, "samples", self.batch)

    def from_samples(self, inputs: Batch, target: Batch = None) -> Report:
        """This report, its other batches cut or repeated from `inputs` (and
        `target`) instead of its own example: more real samples of the same
        step, such as the example find_batch_size had to cut before a step
        ran (a step whose memory follows the values measures them)."""
        if not hasattr(self._record_at, "drawing_from"):
            raise ValueError("[from_samples] this report cannot record other batches")
        return Report(self.native, self.timeline,
                      (self._trainable_sizes, self._largest_unit_bytes),
                      self._record_at.drawing_from(inputs, target), self._compiled,
                      self.loop_notes, self.value_sized_ops, self.output_per_sample,
                      self.output_kept)

    def measure_step(self, batch: int) -> tuple[_memfit.Report, _memfit.Timeline] | None:
        """(C++ report, timeline) of the step at `batch`, or None when it ran
        out of memory: the measurement memfit's search calls back. This
        report's own batch is recorded already: measuring it is free."""
        if batch == self.batch:
            return self.native, self.timeline
        try:
            r = self.at_batch(batch)
        except torch.cuda.OutOfMemoryError:
            return None
        return r.native, r.timeline

    def prediction(self, batch: int,
                   length: int | None = None) -> _memfit.PredictionCertainty | LengthPrediction:
        """The predicted peak at `batch` and how sure it is: probes grown from
        small batches toward `batch` (see Note [Probing toward the answer]),
        each checked against the ones before it. Returns a
        PredictionCertainty: predicted_bytes, probes, held_out_error (worst
        relative miss), affine, beyond_probes, notes (a miss the held-out
        check cannot see); text() says it in a line.

        length=L (a report of profile(..., seq_dim=)): at `batch` samples L
        long, from the surface over batch and length (length_surface()),
        its held-out error beside it: a LengthPrediction (predicted_bytes,
        held_out_error, beyond_probes, surface, text())."""
        batch = count(batch, "prediction", "batch")
        if length is not None:
            return self._length_prediction(batch, length, "prediction")
        probed = self._probe_toward(batch)
        return probed.certainty_at(batch, self._probed.missed_notes(probed))

    def length_surface(self, lengths: Any = None, batches: Any = None,
                       held_out: Any = None) -> LengthSurface:
        """The peak over batch and length (a report of profile(...,
        seq_dim=)): the step recorded at `batches` x `lengths` (default:
        a quarter, a half and all of the example's length, at its batch
        and half of it) and checked at `held_out` (batch, length) shapes
        outside them (see Note [The peak over batch and length]). Recorded
        on first use and kept."""
        axis = self._length_axis("length_surface")
        if lengths is None and batches is None and held_out is None:
            return axis.default_surface(self.batch, axis.length)
        if lengths is None or batches is None:
            raise ValueError("[length_surface] give both lengths= and batches= (or neither, "
                             "for the default probes)")
        return axis.surface(lengths, batches, held_out)

    def _length_axis(self, what):
        if self.length_axis is None:
            raise ValueError(f"[{what}] a peak over the length needs the length dimension: "
                             f"profile(..., seq_dim=1) (per input, like batch_dim)")
        return self.length_axis

    def _length_prediction(self, batch, length, what):
        axis = self._length_axis(what)
        length = count(length, what, "length")
        surface = axis.default_surface(self.batch, length)
        return LengthPrediction(batch, length, surface.predict_peak_bytes(batch, length), surface)

    def _probe_toward(self, batch, grown=False):
        """The one way a report probes other batches (prediction(),
        predict_peak_bytes(), peak_model(), the HTML page's curve): probes
        grown from around this report's batch toward `batch`, kept and grown
        further when a later call asks for a batch past 8x the largest; past
        batches whose kernels break the line (See Note [Probes past a step's
        odd small batches], probing.py). A model still not affine says so in
        the report's notes too (table(), repr). grown: the probes grown
        toward `batch`, never the ones at `batch` itself (the model over
        all batches, for peak_model())."""
        if self._probed is None:
            if self._record_at is None:
                raise ValueError("[predict_peak_bytes] this report cannot probe other batches")
            self._probed = Probing(self.measure_step, _probe_batches(self.batch),
                                   _memfit.probe_memory_limit(self.mode))
        probed = (self._probed.grown_toward if grown else self._probed.toward)(batch)
        said, new = self._native.notes, self._probed.notes(probed)
        if any(n not in said for n in new):
            self._native.notes = said + [n for n in new if n not in said]
        return probed

    def predict_peak_bytes(self, batch: int, length: int | None = None) -> int:
        """Predicted peak bytes of the same step at `batch`, from probes grown
        toward it (each phase's events fitted as M0 + m*batch on the largest
        probes; the largest wins). prediction(batch) says how sure it is.
        length=L (profile(..., seq_dim=)): at `batch` samples L long, from
        the surface over batch and length; prediction(batch, length=L) says
        its held-out error."""
        batch = count(batch, "predict_peak_bytes", "batch")
        if length is not None:
            return self._length_prediction(batch, length, "predict_peak_bytes").predicted_bytes
        return self.prediction(batch).predicted_bytes

    def data_parallel(self, world_size: int, **options: Any) -> list:
        """Each rank's peak when this step runs on `world_size` ranks, each on
        this report's batch: under DDP (its gradient buckets: one more copy of
        the gradients, or none with gradient_as_bucket_view), ZeRO-1
        (optimizer state sharded), ZeRO-2 (+ gradients) and ZeRO-3/FSDP
        (+ parameters, the largest unit gathered). optimizer_shards="flat"
        splits the optimizer state evenly (DeepSpeed, FSDP); "parameters"
        deals whole parameters as torch's ZeroRedundancyOptimizer does, and
        the fullest rank is predicted. Returns one RankPeak per sharding
        (sharding, peak_bytes, phase, iteration, formula); table() and
        to_json() show them from then on. sharding="fsdp2", with model=
        (and units=, mixed_precision=, cpu_offload=), plans torch's
        fully_shard instead: one row, its host_bytes the host's share. The
        options are memfit.data_parallel.rank_peaks's."""
        return _dp.rank_peaks(self._native, self.timeline, self._trainable_sizes,
                              self._largest_unit_bytes, world_size, **options)

    def __repr__(self):
        return self.table()


def _probe_batches(b):
    if b >= 4:
        return sorted({max(1, b // 4), max(2, b // 2), b})
    return [b, 2 * b, 3 * b]


@with_length_axis  # seq_dim: see LengthAxis
def profile(model: torch.nn.Module, inputs: Batch, target: Batch = None,
            loss_fn: LossFn | None = None, optimizer: OptimizerArg = None, iterations: int = 2,
            batch_dim: int = 0, mode: str | None = None, target_device: str = "cpu",
            cuda_workspace: Size = DEFAULT_CUDA_WORKSPACE, set_to_none: bool = True,
            progress: ProgressArg = None, step: StepFn | None = None,
            compare_eager: bool = False, accumulation_steps: int = 1,
            zero_grad: str = "after_step", train_mode: bool = True,
            seq_dim: Any = None, target_batch_dim: int | None = None,
            keep_output: bool = True) -> Report:
    """Profile `iterations` training iterations of `model` on `inputs`.

    Each iteration runs the phases inputs, forward, loss, backward,
    optimizer_step, zero_grad (after a first "parameters" phase that puts a
    copy of the weights on the device) under memfit's recorder, and the
    report explains each phase's delta, the categories at the peak and the
    activations each module saves.

    - inputs: a tensor, or a tuple/list (passed as positional arguments) or
      dict (keyword arguments) of tensors; batch along `batch_dim`: an int,
      or one entry per input (a tuple beside a tuple, a dict beside a dict),
      None for an input shared by every sample (a mask of shape (1, ...)):
      batch_dim=(0, None). The target is batched along the first int, or
      along target_batch_dim (a (batch,) label beside seq-first inputs of
      batch_dim=1: target_batch_dim=0).
    - target: passed to the loss; loss_fn(output, target) must return a
      scalar (without a target: loss_fn(output), or loss_fn(output, None)
      when it takes two arguments). Without loss_fn: cross-entropy for
      integer targets, MSE for float targets, or the output itself when it
      is a scalar.
    - optimizer: a torch.optim.Optimizer over model.parameters() (one
      wrapped in memfit.offload too), a list of them over different
      parameters stepped in turn ([muon, adamw]), or "adam",
      "adam-offload", "sgd", "momentum", or None (no optimizer step).
    - mode: where the step is measured (See Note [Measured on the device],
      places.py). "device": on the device the model is on, held to its own
      limit: a CUDA card (its caching allocator's counters) or, on the CPU,
      the simulated device around the call (memfit.simulated_device).
      "cpu" rehearses the step for real on the CPU; "meta" on meta tensors
      (exact sizes, no memory, no time), falling back to "cpu", saying so
      in the notes, where this torch lacks a meta kernel, and for a CPU
      target where the step has RNN modules (nn.LSTM, nn.GRU, nn.RNN),
      whose CPU kernels meta does not size (See Note [What meta mode
      cannot size in an RNN]): both plan a card you do not have. None
      (the default): "device" where memfit sees the device the model is
      on (a card, the simulated device), else "cpu".
      report.truth says which it holds.
    - target_device="cuda" adds the CUDA caching allocator's view (rounding,
      segments, `cuda_workspace` bytes of cuBLAS workspaces: by default two
      of Hopper's 32 MiB, the forward's thread's and autograd's, and
      cuBLASLt's block; give the card's own total to plan closer).
    - set_to_none: how zero_grad ends each iteration. True (the default, as
      torch's): the gradients are freed. False: zeroed in place, so they stay
      alive through the next iteration's forward and backward, as the
      accumulated gradients do between the micro-batches of a split step:
      the step memfit.Trainer measures to choose its micro-batch (see Note
      [The first micro-batch from the fit], trainer.py). The report's notes
      say so.
    - accumulation_steps: micro-batches per optimizer step in your loop (the
      gradients of the first alive through the later ones; two are
      recorded per optimizer step, each an iteration of the report).
      zero_grad: "after_step" (the default, torch's quickstart) or
      "before_backward" (the tutorial order: the last step's gradients are
      alive through the forward). See Note [The loop the user runs]
      (step_protocol.h).
    - train_mode: True (the default) measures the step with model.train(),
      as it trains: a model left in eval mode (after validation, or by
      from_pretrained) is switched for the step and put back, and the notes
      say so. False: each module's train/eval flag as it is.
    - keep_output: True (the default) keeps the model's output alive until
      the next forward replaces it, as PyTorch's quickstart (`pred =
      model(X); loss = loss_fn(pred, y)`) and Hugging Face's loop (`outputs
      = model(**batch)`) do: a language model's logits are its largest
      tensor. False: dropped once the loss exists, as in
      `loss_fn(model(x), y).backward()` or a Lightning training_step.
    - The step starts with what the model and optimizer hold now: the
      optimizer's state (Adam's after a step, a resumed checkpoint,
      Adagrad's from construction) and any .grad are copied in and counted
      (See Note [State the step starts with], user_state.py).
    - progress: None (silent), True (a line on stderr as each phase is
      recorded: a meta step of a large model takes seconds), or a callable
      given each line.
    - step: the user's own step instead of loss_fn and target,
      step(model, batch) -> loss, given `inputs` (or the part of it a probe
      uses, cut along batch_dim) as `batch`; memfit runs backward and the
      optimizer. A loop of several backwards (retain_graph=True) returns
      its losses as a tuple, each backward in turn. See Note [The step
      function's contract] (user_step.py). A
      Hugging Face model given labels in a dict batch needs neither: its
      output's loss is the loss.
    - seq_dim: the length dimension of the inputs (an int, or per input
      like batch_dim; None for an input without one), for variable-length
      data: the report then predicts the peak over batch and length,
      predict_peak_bytes(batch, length=L), prediction(batch, length=L)
      with its held-out error, length_surface() (see Note [The peak over
      batch and length], length_surface.py). The target is resized with
      the inputs where it has the length (token labels).

    - A compiled model (torch.compile(model), model.compile(), or modules
      of it compiled) is recorded as its step runs once compiled: warmed up
      outside the recording, then recorded warm; what compiling cost (time,
      host memory, graphs, graph breaks, recompiles) is in report.compile
      and the notes, never in the step's bytes. compare_eager=True records
      the eager step too: "compiling saves 224 MiB (33%) of this step's
      peak" (report.compare_eager()). On mode="meta" the eager step is
      recorded, and the notes say so.

    The step runs on copies: the model's weights, buffers and .grad, the
    optimizer's state and learning rate, the inputs and the RNG state are
    left exactly as they were (see Note [A rehearsed step leaves no trace]).
    Returns a Report: peak_bytes, phases, categories_at_peak, modules,
    table(), to_json(), save_svg(path), predict_peak_bytes(batch), and
    data_parallel(world_size): each rank's peak under DDP, ZeRO-1/2/3.
    """
    optimizer = unwrapped_optimizer(optimizer)  # accelerate's or Lightning's wrapper
    check_optimizer(model, optimizer, "profile")
    how = as_user_step(loss_fn, step, "profile", model)
    said = as_progress(progress, "profile")
    if target_device not in ("cpu", "cuda"):
        raise ValueError(
            f"[profile] target_device must be 'cpu' or 'cuda', got {target_device!r}"
        )
    place = place_of(mode, model, target_device, "profile")
    iterations = count(iterations, "profile", "iterations")
    loop = as_loop(set_to_none, accumulation_steps, zero_grad, train_mode, "profile",
                   keep_output)
    if not isinstance(compare_eager, bool):
        raise ValueError(f"[profile] compare_eager must be True or False, got {compare_eager!r}")
    target_dim = target_batch_dim_of(batch_dim, target_batch_dim, "profile")
    meta = _checked_inputs(model, inputs, target, batch_dim, target_dim, how, place)
    recorder = _StepRecorder(model, how, optimizer, iterations, place, loop, said,
                             target_device, to_bytes(cuda_workspace, "profile"), meta,
                             batch_dim, _loop_notes(loop, model, optimizer))
    recorder.compiled = _compiled_recordings(model, compare_eager, recorder, inputs, target)
    native, timeline = recorder.run(inputs, target)
    if compare_eager:
        report = Report(native, timeline, compiled=recorder.compiled)
        native.notes = native.notes + [recorder.compiled.comparison(report)]

    record_at = _Batches(recorder, inputs, target, batch_dim, target_dim)
    sizes = (_dp.trainable_sizes(model), _dp.largest_unit_bytes(model))
    return Report(native, timeline, sizes, record_at, recorder.compiled, recorder.loop_notes,
                  recorder.value_sized_ops, recorder.output_per_sample, loop.keep_output)


class _Batches:
    """A Report's record_at: the step recorded at n samples cut or repeated
    from `inputs` (and the target along target_dim), `samples` real ones."""

    def __init__(self, recorder, inputs, target, batch_dim, target_dim):
        self.recorder, self.inputs, self.target = recorder, inputs, target
        self.batch_dim, self.target_dim = batch_dim, target_dim
        self.samples = batch_size(inputs, batch_dim, "profile")

    def __call__(self, n):
        # The cut or repeated batch is memfit's, made on the host: only the
        # step's own copy of it counts (under a simulated device too).
        with host_memory():
            x = resize_batch(self.inputs, n, self.batch_dim)
            y = None if self.target is None else resize_batch(self.target, n, self.target_dim)
        return self.recorder.run(x, y)

    def drawing_from(self, inputs, target):
        return _Batches(self.recorder, inputs, target, self.batch_dim, self.target_dim)


def _checked_inputs(model, inputs, target, batch_dim, d, how, place):
    """Checks the batch against the model and the place it runs at (the
    target batched along `d`); returns what holds meta tensors ("inputs
    are", ...) or None."""
    b = check_samples(inputs, target, batch_dim, d, "profile")
    how.check_batch(model, inputs, target)
    meta = _meta_tensors(model, inputs, target)
    if place.mode != "meta":
        _check_copy_fits(inputs, target, b)
    if place.mode != "meta" and meta:
        raise ValueError(
            f"[profile] the {meta} on the meta device (shapes without values), and "
            f"mode={place.mode!r} runs the step on real values: pass mode='meta', or real "
            f"tensors")
    return meta


def _compiled_recordings(model, compare_eager, recorder, inputs, target):
    """A compiled model's recordings (CompiledRecordings), else None."""
    paths = compiled_paths(model)
    if paths:
        return CompiledRecordings(paths, lambda: recorder.run(inputs, target, eager=True)[0])
    if compare_eager:
        raise ValueError("[profile] compare_eager=True compares a compiled model's step with "
                         "its eager step, and this model is not compiled: pass "
                         "torch.compile(model), or leave compare_eager out")
    return None


class _StepRecorder:
    """Records the profiled step at any batch, at its Place: the one way
    profile() and its probes measure a step. The step trains on copies, and
    the RNG it draws from is put back: see Note [A rehearsed step leaves no
    trace]."""

    def __init__(self, model, how, optimizer, iterations, place, loop, said, target_device,
                 cuda_workspace, meta, batch_dim, loop_notes):
        self.model, self.how, self.optimizer = model, how, optimizer
        self.iterations, self.place, self.loop, self.said = iterations, place, loop, said
        self.target_device, self.cuda_workspace = target_device, cuda_workspace
        self.meta, self.batch_dim, self.loop_notes = meta, batch_dim, loop_notes
        self.compiled = None
        self.value_sized_ops = []  # the first recording's: the example batch's
        self.output_per_sample = 0.0  # the first recording's too
        # mode='meta': None until the first recording decides, then whether
        # each step is rehearsed on the CPU instead (its RNNs, kernels meta
        # does not size), and the peaks there by batch (See Note [What meta
        # mode cannot size in an RNN], meta_rnn.py).
        self.meta_on_cpu = None
        self.cpu_peaks = {}
        self.switches = KernelSwitches()  # profile()'s: each later probe runs under them

    def run(self, inputs, target, eager=False):
        """(C++ report, timeline) of the step on `inputs`."""
        notes = []
        reads = MetaReads()  # See Note [Data-dependent reads on the meta device].
        with self.switches.entered(), kept_rng(), no_user_post_hooks(self.optimizer):
            rec, mode = self._rehearse(inputs, target, eager, reads, notes)
        return self._report(rec, mode, inputs, eager, reads, notes)

    def _rehearse(self, inputs, target, eager, reads, notes):
        """The RecordedStep at the place (meta falls back to the CPU where
        this torch lacks a meta kernel), and the mode it ran in."""
        mode, place = self.place.mode, self.place
        if mode == "meta" and self.meta_on_cpu:
            return self._on_cpu(inputs, target, eager), "cpu"
        # For a card, the optimizer a GPU would run: See Note [The optimizer
        # a GPU would run].
        card = self.target_device == "cuda"
        try:
            with contextlib.ExitStack() as stack:
                if mode == "meta":
                    stack.enter_context(reads.answering())
                foreach = stack.enter_context(
                    foreach_as_on_cuda(self.optimizer if card else None))
                rec = rehearse(self.model, inputs, target, self.how, self.optimizer,
                               self.iterations, place.device, self.loop, self.said,
                               as_on_cuda=card, eager=eager, counters=place.counters)
            if foreach or rec.ran_foreach:
                notes.append("the optimizer ran its foreach implementation, as torch "
                             "does for CUDA parameters (temporaries as large as all "
                             "parameters); see Note [The optimizer a GPU would run]")
            if mode == "meta" and self.meta_on_cpu is None:
                self.meta_on_cpu = self._first_meta_recording(rec, inputs, target, eager)
            if not (mode == "meta" and self.meta_on_cpu):
                return rec, mode
        except (NotImplementedError, RuntimeError) as e:
            if mode != "meta" or isinstance(e, torch.cuda.OutOfMemoryError):
                raise
            first = str(e).splitlines()[0]
            first = first if first.startswith("[profile]") else first[:160]
        else:  # the CPU's RNN kernels: See Note [What meta mode cannot size in an RNN].
            del rec  # the meta step's record, before the CPU's step
            return self._on_cpu(inputs, target, eager), "cpu"
        # Outside the except: its traceback holds the meta graph.
        if self.meta and first.startswith("[profile]"):
            raise ValueError(f"{first} (the {self.meta} on the meta device)")
        if self.meta:
            raise ValueError(
                f"[profile] meta mode is unavailable in this torch ({first}), and "
                f"the {self.meta} on the meta device, which cpu mode cannot run: pass "
                f"real tensors"
            )
        # With the loop's notes: find_batch_size's answer says why its mode is cpu.
        fallback = f"meta mode could not run this step ({first}); fell back to cpu mode"
        if fallback not in self.loop_notes:
            self.loop_notes.append(fallback)
        return self._on_cpu(inputs, target, eager), "cpu"

    def _on_cpu(self, inputs, target, eager):
        """The RecordedStep of a meta-mode step rehearsed on the CPU. Once
        meta_on_cpu, a batch the host has not the room for (the line
        through the largest two batches recorded there) is refused, not run
        into the host's out-of-memory killer."""
        n = batch_size(inputs, self.batch_dim, "profile")
        need, free = host_bytes_at(self.cpu_peaks, n), free_host_bytes()
        if self.meta_on_cpu and need > free:
            fmt = _memfit.format_bytes
            raise ValueError(
                f"[profile] mode='meta' rehearses this step on the CPU (its notes say why), "
                f"and batch {n} would take about {fmt(need)} there, more than this host's "
                f"{fmt(free)} free: plan a smaller budget, or pass target_device='cuda' to "
                f"plan a card on meta")
        rec = rehearse(self.model, inputs, target, self.how, self.optimizer, self.iterations,
                       torch.device("cpu"), self.loop, self.said, eager=eager)
        self.cpu_peaks[n] = max(self.cpu_peaks.get(n, 0), peak_bytes(rec.timeline))
        return rec

    def _first_meta_recording(self, rec, inputs, target, eager):
        """Whether a meta-mode step is rehearsed on the CPU, from its first
        meta recording `rec` (of `inputs`): for its RNN modules (See Note
        [What meta mode cannot size in an RNN]), or where one CPU step of
        the same batch peaks higher (See Note [Meta mode checked against the
        CPU's kernels]). What meta leaves out goes with the loop's notes,
        into every report and find_batch_size's answer: that the step ran
        on the CPU, or the RNNs and the convolutions' workspace (See Note
        [Workspace meta mode cannot see]) it does not count."""
        labels = rnn_modules(self.model)
        meta_peak = peak_bytes(rec.timeline)
        if self.target_device == "cpu" and not self.meta and \
                HEADROOM * meta_peak <= free_host_bytes():
            if labels:
                self.loop_notes.append(on_cpu_note(labels))
                return True
            if not is_checked():
                return False
            n = batch_size(inputs, self.batch_dim, "profile")
            cpu_peak = peak_bytes(self._on_cpu(inputs, target, eager).timeline)
            if cpu_peak > meta_peak * (1 + CHECK_TOLERANCE):
                self.loop_notes.append(cpu_kernels_note(n, meta_peak, cpu_peak))
                return True
            self.loop_notes.append(checked_note(n, meta_peak, cpu_peak))
        if labels:
            why = (f"the {self.meta} on the meta device, which the CPU cannot run" if self.meta
                   else "this host has not the room to rehearse it on the CPU")
            self.loop_notes.append(unsized_note(labels, self.target_device, why))
        # A card's is find_batch_size's own: See Note [cuDNN's workspace at the step's peak].
        workspace = workspace_note(self.model, "meta", rec.timeline)
        if workspace and self.target_device == "cpu":
            self.loop_notes.append(workspace)
        return False

    def _report(self, rec, mode, inputs, eager, reads, notes):
        """The C++ report and timeline of a recorded step, with its notes."""
        if self.how.note:
            notes.append(self.how.note)
        notes.extend(self.loop_notes)
        if self.meta:
            notes.append(f"unverified: the {self.meta} on the meta device (shapes without "
                         f"values), so no step can run for real to check these figures")
        if mode == "meta" and reads.note():
            notes.append(reads.note())
        n = batch_size(inputs, self.batch_dim, "profile")
        ops = rec.tracking.value_sized_ops
        if ops:  # See Note [Memory that depends on the batch's values] (op_frames.h).
            notes.append(profile_note(ops, n))
            self.value_sized_ops = self.value_sized_ops or ops
        if rec.output_bytes and not self.output_per_sample:
            self.output_per_sample = rec.output_bytes / n
        if self.compiled is not None and not eager:
            notes.extend(self.compiled.add(n, rec.compile))
        model = type(getattr(self.model, "_orig_mod", self.model)).__name__  # torch.compile's
        counters = self.place.counters
        if counters is not None:  # a card: its own counters, See Note [Measured on the device]
            native, timeline = counters.report(model, n, optimizer_name(self.optimizer))
            notes.append(counters.note())
        else:
            # See Note [Workspace meta mode cannot see] (workspace_note.py).
            workspace = workspace_note(self.model, mode, rec.timeline)
            if workspace and workspace not in notes:  # meta's is with the loop's
                notes.append(workspace)
            self.said.step(f"explain batch {n}'s {len(rec.timeline)} allocations and frees")
            timeline = rec.timeline
            native = _memfit.make_report(timeline, model, n, optimizer_name(self.optimizer), mode)
            if self.target_device == "cuda":  # every batch recorded, for the same card
                native.set_cuda_estimate(timeline, self.cuda_workspace)
                # A flagged range: See Note [cuDNN's workspace at the step's peak].
                cudnn = _memfit.cudnn_workspace_note(timeline, rec.conv_workspaces, n)
                if cudnn:
                    notes.append(cudnn)
        if rec.host_bytes:
            notes.append(f"optimizer state and step on the host: "
                         f"{_memfit.format_bytes(rec.host_bytes)} of host memory (parameter "
                         f"copies, gradient buffers, state), not in the device's figures")
        if self.loop.keep_output and rec.output_bytes * 100 >= native.peak_bytes:
            notes.append(kept_output_note(rec.output_bytes, n))
        grows = growth_note([p.as_dict() for p in native.phases], n)
        if grows:  # See Note [A step whose memory grows step after step] (step_growth.py).
            notes.append(grows)
        native.notes = notes
        native.truth = self.place.truth if mode == self.place.mode else "rehearsed on the CPU"
        return native, timeline


def _loop_notes(loop, model, optimizer):
    """What a report says of the loop it measures and of the state the step
    starts with (See Note [State the step starts with])."""
    notes = [loop.note()] if loop.note() else []
    switched = eval_modules(model) if loop.train_mode else 0
    if switched:
        notes.append(f"{switched} module(s) are in eval mode: the step is measured in train "
                     f"mode, as it trains (dropout's masks, BatchNorm's statistics), and "
                     f"their modes are put back; pass train_mode=False to measure them as "
                     f"they are")
    held = {}
    for s in step_tensors(model, optimizer):
        if s.kind in ("gradient", "optimizer_state"):
            held[s.kind] = held.get(s.kind, 0) + s.tensor.numel() * s.tensor.element_size()
    fmt = _memfit.format_bytes
    said = [f"{fmt(b)} of {'optimizer state' if k == 'optimizer_state' else '.grad'}"
            for k, b in sorted(held.items(), reverse=True) if b]
    if said:
        notes.append("the step starts with what the model and optimizer hold now: "
                     + " and ".join(said) + ", counted from the first phase (a fresh "
                     "optimizer, or zero_grad(set_to_none=True) first, starts with none)")
    return notes


def _check_copy_fits(inputs, target, samples):
    """Raises ValueError when the step's own copy of the batch (the step
    runs on copies: Note [A rehearsed step leaves no trace]) cannot fit in
    this machine's memory, as for a stride-0 batch (x.expand(2**40, 16))
    that takes almost nothing itself."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    dense = sum(t.numel() * t.element_size() for t in tensors_in(inputs) + tensors_in(target)
                if not t.is_meta)
    if dense > ram:
        fmt = _memfit.format_bytes
        raise ValueError(
            f"[profile] the inputs hold {samples} samples, and the step's copy of them would "
            f"take {fmt(dense)}, more than this machine's {fmt(ram)} (a stride-0 tensor from "
            f"expand() takes almost nothing until copied): pass a smaller example batch; "
            f"report.predict_peak_bytes(n) and find_batch_size answer for larger ones, or "
            f"pass mode='meta'")


def _meta_tensors(model, inputs, target):
    """What holds meta tensors ("inputs are", "model's parameters or
    buffers are"), or None."""
    if any(t.is_meta for t in tensors_in(inputs) + tensors_in(target)):
        return "inputs are"
    if any(t.is_meta for t in list(model.parameters()) + list(model.buffers())):
        return "model's parameters or buffers are"
    return None
