"""memfit.lazy: record a computation on a batch, run it in chunks that fit."""

from __future__ import annotations

from typing import Any

import torch

from .._step.arguments import flag
from .graph import BatchInt, LazyError
from .run import LazyRun, last_run, read
from .tensor import LazyTensor, install_module_hook, lazy_leaf

__all__ = ["LazyTensor", "LazyError", "LazyRun", "BatchInt"]


def lazy(*tensors: torch.Tensor, batch: int = 0, allow_mixing: bool = False,
         device: torch.device | str | None = None) -> Any:
    """Wrap tensors so that what is computed from them runs in chunks that fit.

        x, y = memfit.lazy(x, y, batch=0)
        loss = criterion(model(x), y)        # recorded, not run
        loss.backward()                       # runs in chunks; full-batch gradients
        print(loss.item())                    # cached: the forward does not run again

    Mixed precision (AMP) is written as in PyTorch's recipe; only the
    lazy() line is added:

        scaler = torch.amp.GradScaler("cuda")   # or "cpu"
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            x, y = memfit.lazy(x, y, batch=0)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = criterion(model(x), y)    # recorded under autocast
            scaler.scale(loss).backward()        # chunks run under autocast
            scaler.step(opt)
            scaler.update()

    Returns one LazyTensor for one tensor, a tuple for several. `batch` is
    the dimension that indexes samples: an int for all tensors, or one
    entry per tensor; None marks a tensor that is the same for every sample
    (used whole in every chunk).

    A batch bigger than the device can stay in host memory: with `device`
    ("cuda", "cuda:1", or "cpu" for the simulated device), tensors that are
    not on it (CPU RAM beside a GPU; on the simulated device, memory
    allocated under memfit.host_memory()) stay where they are, and each
    micro-batch is copied to the device as it runs (from pinned memory,
    non_blocking, on CUDA), so the device holds one micro-batch of the
    batch at a time:

        x, y = memfit.lazy(x_cpu, y_cpu, batch=0, device="cuda")
        loss = criterion(model(x), y)        # the model is on the GPU
        loss.backward()

    An out-of-memory error says when the batch's own data is what does not
    fit (a batch on the device that leaves too little for the step).

    What it does. Operations on lazy tensors (torch functions, tensor
    methods and operators, nn.Module calls, torch.nn.functional calls) are
    recorded, not run; each is tried at once on the first 2 and 3 samples,
    which gives the shapes, dtypes and any error at the line that caused
    it. A result is computed when it is needed: backward(), item(),
    tolist(), numpy(), bool(), float(), printing, memfit.eager(t). memfit
    then picks the chunk size: the largest that fits the memory available
    (CUDA: free memory plus what PyTorch's cache holds; CPU: the budget of
    memfit.simulated_device minus what is allocated now; no budget: one
    chunk), keeping 10% free. What a chunk of c samples needs is measured
    once, by running the step on 2 and 3 samples (M(c) = M0 + m*c, fitted
    at every allocation on CPU), and cached for later steps of the same
    shapes, like the probes. Chunks are balanced (100 samples that fit 64
    run as 50 + 50). memfit.last_lazy_run() tells what happened.

    backward() accumulates into .grad exactly the full batch's gradients:
    each chunk's loss is weighted by how the loss reduces the batch (mean:
    c_i/B; sum: 1; cross_entropy/nll_loss: the chunk's share of counted
    targets, so class weights and ignore_index are exact). A loss made of
    several terms works when it is linear in them (ce + 0.1 * mse, plus
    terms that do not depend on the batch, divided by a mask count...).
    Values read are concatenated along the batch dimension; a mean or a sum
    read back is combined from the chunks. Values of lazy tensors you still
    hold are kept from the chunked run, so reading them later does not run
    the forward again.

    An out-of-memory error in a chunk frees what the chunk held, halves the
    chunk and redoes it: gradients already accumulated stay, no sample is
    dropped or counted twice (parameters the failed backward had already
    completed are left out of the redo), and buffers the failed forward
    wrote (BatchNorm's running statistics, counters) are put back as they
    were before it.

    Limits:
    - Operations that mix samples across the batch change meaning when
      split, and raise LazyError naming the operation: BatchNorm in
      training mode, a reduction over the batch whose result meets
      per-sample values again (x - x.mean(0)), softmax/cumsum/sort/flip over
      the batch dimension, selecting samples by position (x[0], x[:4],
      index_select on the batch), pairwise products of samples, attention or
      recurrence run across the batch (batch_first mismatches). With
      allow_mixing=True such a computation runs whole, in one chunk, as
      eager PyTorch would.
    - A module called on lazy tensors is recorded as one step and runs on
      real tensors in each chunk, so anything inside it works, but memfit
      sees only its outside: it checks for BatchNorm layers in training
      mode and the batch_first convention; mixing done by other code inside
      a forward is not detected. (A module returning a value reduced over
      the batch, such as a custom loss, has its forward recorded op by op.)
    - What the probes learn is cached per operation and input shapes, so
      later steps record at almost no cost; a module whose output shapes
      change with a Python attribute is caught when computed (LazyError),
      and recording again works.
    - The loss must reduce the batch with a sum, a mean or a torch loss
      function (not e.g. a max or a median over samples), combined linearly.
    - Dropout draws new masks for each chunk (each sample still gets one),
      so results equal eager ones only without randomness.
    - In-place changes of lazy tensors (x += 1, x.add_(), x[0] = 1,
      inplace=True) are refused: the tensor is recomputed for each chunk.
      Inside a module, a forward that writes into its input (x.mul_(2))
      changes each sample of your tensor once, as eager does (the probes
      and memory measurements run on copies, and put back the RNG and the
      modules' buffers); a chunk that ran out of memory after such a write
      is not redone (LazyError): the write would count twice.
    - A plain tensor that holds one entry per sample must be made lazy too,
      except targets of torch loss functions and operands of elementwise
      operations, which memfit slices with the chunk. x.size(0) and
      x.shape[0] give BatchInts, which follow the chunk size in shape
      arguments (x.view(x.size(0), -1)).
    - Modules and parameters are used as they are when the result is
      computed. isinstance(x, torch.Tensor) is True for a lazy tensor (so
      GradScaler.scale and other code written for tensors accept it);
      type(x) is memfit.LazyTensor.
      backward(create_graph=True) is not supported. A batch of one sample,
      or tensors with batch=None, are computed at once.

    The first call wraps nn.Module.__call__ (a module called on lazy
    tensors is recorded as one step; any other call goes straight to the
    original): the wrapper stays for the rest of the process. A call whose
    arguments are refused installs nothing.

    Raises TypeError for a non-tensor, ValueError for a batch dimension out
    of range, an empty batch, or tensors with different batch sizes.
    """
    if not tensors:
        raise TypeError("memfit.lazy() expects at least one tensor")
    if isinstance(batch, (list, tuple)):
        if len(batch) != len(tensors):
            raise ValueError(
                f"[lazy] batch has {len(batch)} entries for {len(tensors)} tensors: give one "
                f"batch dimension per tensor, or one int for all"
            )
        dims = list(batch)
    else:
        dims = [batch] * len(tensors)
    if device is not None:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"[lazy] device must name a torch device, got {device!r}") from e
    out = []
    sizes = {}
    for i, (t, d) in enumerate(zip(tensors, dims)):
        what = f"tensor {i}" if len(tensors) > 1 else "the tensor"
        if isinstance(t, LazyTensor):
            raise TypeError(f"[lazy] {what} is already lazy")
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"[lazy] expected torch.Tensor arguments, got {type(t).__name__} for {what}"
            )
        if d is not None:
            if isinstance(d, bool) or not isinstance(d, int):
                raise ValueError(f"[lazy] batch must be an int or None, got {d!r}")
            if t.dim() == 0 or not -t.dim() <= d < t.dim():
                raise ValueError(
                    f"[lazy] batch dimension {d} is out of range for {what} of shape "
                    f"{tuple(t.shape)} (valid: {-t.dim()}..{t.dim() - 1}, or None for a "
                    f"tensor that is the same for every sample)"
                    if t.dim() else
                    f"[lazy] {what} is a 0-dimensional tensor and has no batch dimension "
                    f"(use batch=None for a tensor that is the same for every sample)"
                )
            d = d % t.dim()
            if t.shape[d] == 0:
                raise ValueError(
                    f"[lazy] {what} of shape {tuple(t.shape)} has 0 samples along batch "
                    f"dimension {d}: there is nothing to compute"
                )
            sizes[i] = t.shape[d]
        out.append((t, d))
    if len(set(sizes.values())) > 1:
        detail = ", ".join(f"tensor {i}: {n}" for i, n in sizes.items())
        raise ValueError(
            f"[lazy] the tensors hold different numbers of samples ({detail}); tensors "
            f"made lazy together must hold the same samples"
        )
    # Only once the arguments are valid: the hook stays for the process.
    install_module_hook()
    out = [lazy_leaf(t, d, flag(allow_mixing, "lazy", "allow_mixing"), device) for t, d in out]
    return out[0] if len(out) == 1 else tuple(out)


def eager(t: Any) -> Any:
    """The real tensor of a lazy tensor: computed now (in chunks that fit,
    concatenated along the batch dimension), and cached.

    Under autograd, a result that requires grad is computed whole so that
    it carries its autograd graph, exactly as eager PyTorch would. Tuples,
    lists and dicts of lazy tensors are converted element by element;
    anything else is returned as is.
    """
    if isinstance(t, LazyTensor):
        return read(t.node, grad=True)
    if isinstance(t, (tuple, list)):
        return type(t)(eager(x) for x in t)
    if isinstance(t, dict):
        return type(t)((k, eager(v)) for k, v in t.items())
    return t


def last_lazy_run() -> LazyRun | None:
    """How memfit ran the last lazy computation: a LazyRun (chunks, OOMs
    recovered from, chunk limit, measured bytes per sample...), or None."""
    return last_run()
