"""4-bit QLoRA and 8-bit AdamW as advise settings, through torchao.

Note [Why torchao, not bitsandbytes]: both run on the CPU here (torchao
0.18.0, bitsandbytes 0.50.2's CPU backend). Only torchao quantizes on the
meta device: its NF4Tensor is a tensor subclass over plain PyTorch ops, so
to_nf4 of a meta weight is a meta NF4Tensor with exact sizes, and its
linear runs on meta; bitsandbytes' Params4bit quantizes only in .to(cpu or
cuda), and its Linear4bit forward on meta fails an assertion on the
unquantized shape. advise plans an 8B model on meta, so QLoRA is torchao's
here, and 8-bit AdamW keeps torchao's state (OptimState8bit) too: one
library. torchao's AdamW8bit compiles its step with torch.compile for each
parameter (185 s on meta, 370 s on this CPU for three small parameters:
inductor's C++ build), so AdamW8bit here steps torchao's own update
eagerly, a slice of at most SLICE elements at a time: the state is
torchao's byte for byte; the step's temporaries are bounded by a slice, as
the compiled kernel bounds them on a card. Paged optimizers (bitsandbytes'
PagedAdamW) move state through CUDA unified memory: CUDA only, a note.

Note [NF4 bytes]: torchao's to_nf4(w, block_size=64, scaler_block_size=256)
of a weight of n elements holds n/2 bytes of 4-bit codes (uint8, two a
byte), one int8 scale per block of 64 (n/64 bytes: the blocks' absmax
quantized again), one bf16 factor per 256 scales (2n/16384 bytes), a bf16
mean of the scales (2 bytes) and the 16 bf16 NF4 levels (32 bytes):
nf4_bytes(n) = n/2 + n/64 + n/8192 + 34. It needs n divisible by 64 x
256; other weights stay bf16.

Note [NF4 on meta]: to_nf4 of a meta weight runs the quantization's ops
on meta, Python meta kernels mostly (Llama-3-8B's 224 projections: about
12 s a copy), and so does each dequantization in forward and backward
(3 ms each; 9,360 in the 8B advise: 27 s). On meta both depend only on
shapes and dtypes. So each weight shape is quantized once and the others
get new meta inner tensors shaped as its (the same NF4Tensor, byte for
byte); and the weights are a MetaNF4Tensor whose dequantization is
replayed (See Note [Replayed on meta]).

Note [Replayed on meta]: on meta, an op computes nothing; what it
allocates and frees depends only on shapes, dtypes and the code. Where
memfit runs torchao's Python code on meta many times over the same
shapes (an NF4 dequantization, an 8-bit AdamW slice), the first run of a
key is recorded under a second Recorder (the recording under way sees
it as it is), and each later run replays those allocations and frees in
order as plain meta allocations of the same bytes: the same live bytes,
peaks and CUDA caching allocator replay, at a fraction of the dispatch
(the ops' names in the timeline become aten::empty). A run that frees
what it did not allocate, or whose result is not one new tensor, is not
replayed.

Note [Repeated slices on meta]: on meta, 8-bit AdamW's step of an 8B
model is about 2,000 slices, each some 40 ops through torchao's tensor
subclass and Python meta kernels (14 ms a slice: 56 s a recording of two
steps). A slice allocates its temporaries and frees them all before the
next; slices of the same size, dtypes and state, starting from the same
live bytes, rise and fall the same way. So on meta a slice runs once a
step for each such (size, dtypes, state, live bytes): the live bytes stay
the same between the slices of a parameter and, once every state exists,
between parameters. The allocated peak and every phase's are unchanged;
the CUDA caching allocator replayed on the fewer events reuses the blocks
the first slice freed (bench/llm_settings.py --size 8B: every row and
plan the same). The slices that do run are replayed after the first of
their size (See Note [Replayed on meta]): the 8-bit rows 56 s -> under
1 s a recording."""

from __future__ import annotations

import logging
from typing import Sequence

import torch

from ..._native import native as _memfit

__all__: list = []

NF4_BLOCK, NF4_SCALER_BLOCK = 64, 256
# QLoRA's adapters on every projection of a block (the QLoRA paper, Unsloth).
QLORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SLICE = 1 << 22  # elements of a parameter one eager 8-bit AdamW update handles at once
_ADAM8_BLOCK = 256  # torchao's 8-bit state: one fp32 scale per 256 values


def torchao_available() -> bool:
    """Whether torchao imports (its CUDA extensions may fail to load here:
    they are logged, and not needed)."""
    log = logging.getLogger("torchao")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        import torchao  # noqa: F401
        from torchao.optim import AdamW8bit as _  # noqa: F401
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4  # noqa: F401
    except ImportError:
        return False
    finally:
        log.setLevel(level)
    return True


def nf4_bytes(numel: int) -> int:
    """Bytes of torchao's NF4Tensor of a weight of `numel` elements (See
    Note [NF4 bytes])."""
    if not quantizable(numel):
        raise ValueError(f"[nf4_bytes] {numel} elements is not a multiple of "
                         f"{NF4_BLOCK * NF4_SCALER_BLOCK}: torchao keeps such a weight unquantized")
    scalers = numel // NF4_BLOCK
    return numel // 2 + scalers + 2 * (scalers // NF4_SCALER_BLOCK) + 2 + 2 * 16


def quantizable(numel: int) -> bool:
    return numel > 0 and numel % (NF4_BLOCK * NF4_SCALER_BLOCK) == 0


def to_nf4_linears(model: torch.nn.Module, names: Sequence[str] = QLORA_MODULES) -> int:
    """Replaces, in place, the weight of every nn.Linear of `model` named
    one of `names` (by the last part of its path) by a frozen torchao
    NF4Tensor of it (the lm_head and embeddings stay as they are, as QLoRA
    does). Returns how many were quantized; a weight whose size is not a
    multiple of 16384 stays (See Note [NF4 bytes])."""
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    done = 0
    made = {}  # on meta: one to_nf4 a weight shape (See Note [NF4 on meta])
    for path, m in model.named_modules():
        if (isinstance(m, torch.nn.Linear) and path.rsplit(".", 1)[-1] in names
                and quantizable(m.weight.numel())):
            w = m.weight.detach()
            key = (tuple(w.shape), w.stride(), w.dtype)
            if w.is_meta:
                if key not in made:
                    made[key] = to_nf4(w, NF4_BLOCK, NF4_SCALER_BLOCK)
                q = _meta_nf4_like(made[key])
            else:
                q = to_nf4(w, NF4_BLOCK, NF4_SCALER_BLOCK)
            m.weight = torch.nn.Parameter(q, requires_grad=False)
            done += 1
    return done


def _meta_nf4_like(t):
    """A new NF4Tensor on meta with inner tensors shaped as `t`'s, whose
    dequantization replays its allocations (See Note [NF4 on meta])."""
    names, ctx = t.__tensor_flatten__()
    inner = {n: torch.empty_like(getattr(t, n)) for n in names}
    return _meta_nf4_class().__tensor_unflatten__(inner, ctx, t.shape, t.stride())


_META_NF4 = []  # the class, made once torchao is imported
_RECORDED = {}  # See Note [Replayed on meta]: key -> (allocations and frees, result's slot)


def _meta_nf4_class():
    if _META_NF4:
        return _META_NF4[0]
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import NF4Tensor

    class MetaNF4Tensor(NF4Tensor):
        @staticmethod
        def __tensor_unflatten__(inner_tensors, metadata, outer_size, outer_stride):
            return MetaNF4Tensor(
                metadata["tensor_meta"], metadata["block_size"], metadata["n_blocks"],
                metadata["scaler_block_size"], inner_tensors["quantized_scalers"],
                inner_tensors["quantization_factor"], inner_tensors["scaler_mean"],
                inner_tensors["quantized_data"], inner_tensors["nf4"])

        # What torchao's NF4Tensor ops return (detach, views, to(device))
        # stays this class: a Parameter needs detach() to keep it.
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return _kept(super().__torch_dispatch__(func, types, args, kwargs))

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return _kept(super().__torch_function__(func, types, args, kwargs))

        def get_original_weight(self):
            key = (tuple(self.shape), self.dtype, self.block_size, self.scaler_block_size,
                   tuple(getattr(self, n).shape for n in self.__tensor_flatten__()[0]))
            return replayed_on_meta(("nf4", key), super().get_original_weight,
                                    (self.shape, self.dtype))

    def _kept(out):
        if type(out) is NF4Tensor and out.is_meta:
            names, ctx = out.__tensor_flatten__()
            return MetaNF4Tensor.__tensor_unflatten__({n: getattr(out, n) for n in names}, ctx,
                                                      out.shape, out.stride())
        if type(out) in (tuple, list):
            return type(out)(_kept(x) for x in out)
        return out

    _META_NF4.append(MetaNF4Tensor)
    return MetaNF4Tensor


def replayed_on_meta(key, run, result=None):
    """run() on meta, whose allocations depend only on `key`: the first
    time under a second Recorder, which keeps what it allocates and frees;
    later, those replayed in order as plain meta allocations (See Note
    [Replayed on meta]). result: None when run() returns nothing it
    allocated, else the (shape, dtype) of the one new contiguous tensor
    it returns. What does not match is run as it is, each time."""
    recorded = _RECORDED.get(key)
    if recorded is not None:
        return _replay(recorded, result)
    rec = _memfit.Recorder()
    rec.only_device("meta")
    rec.drop_meta_kernel_intermediates()
    try:
        out = run()
    finally:
        rec.stop()
    slots, events = {}, []  # an allocation's id -> its slot; (alloc, bytes, slot)
    for kind, nbytes, ident, *_ in rec.timeline.events():
        if kind == "alloc":
            slots[ident] = len(events)
            events.append((True, nbytes, slots[ident]))
        elif ident in slots:
            events.append((False, nbytes, slots.pop(ident)))
        else:
            return out  # a free of something older: not run()'s own
    if result is None:
        if not slots and out is None:
            _RECORDED[key] = (events, None)
    elif (len(slots) == 1 and isinstance(out, torch.Tensor) and out.is_contiguous()
          and out.storage_offset() == 0 and (out.shape, out.dtype) == tuple(result)
          and events[next(iter(slots.values()))][1] == out.untyped_storage().nbytes()):
        _RECORDED[key] = (events, next(iter(slots.values())))
    return out


def _replay(recorded, result):
    events, result_slot = recorded
    live = {}
    out = None
    for alloc, nbytes, slot in events:
        if slot == result_slot:
            out = torch.empty(result[0], dtype=result[1], device="meta")
        elif alloc:
            live[slot] = torch.empty(nbytes, dtype=torch.uint8, device="meta")
        else:
            del live[slot]
    return out


def adam8bit_state_bytes(numel: int) -> int:
    """Bytes of torchao's 8-bit Adam state of one parameter: two
    OptimState8bit (uint8 codes, an fp32 scale per 256, a 256-entry fp32
    map each) where numel >= 4096 and is a multiple of 256, else two fp32
    tensors; plus the fp32 step count."""
    if numel >= 4096 and numel % _ADAM8_BLOCK == 0:
        state = 2 * (numel + 4 * (numel // _ADAM8_BLOCK) + 4 * 256)
    else:
        state = 2 * 4 * numel
    return state + 4


def _adamw8bit_base():
    log = logging.getLogger("torchao")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        from torchao.optim import AdamW8bit as base
        from torchao.optim.adam import single_param_adam
        from torchao.optim.subclass_8bit import OptimState8bit
    finally:
        log.setLevel(level)
    return base, single_param_adam, OptimState8bit


def _slice_state(s, start, stop, state_class):
    """Elements [start, stop) of a flat view of an optimizer state: a plain
    tensor's view, or an OptimState8bit over views of its codes and scales
    (writes land in the state)."""
    if isinstance(s, state_class):
        b = s.block_size
        return state_class(s.codes.view(-1)[start:stop], s.scale[start // b:stop // b], s.qmap,
                           s.signed)
    return s.view(-1)[start:stop]


_EAGER = []  # the class, made once torchao is imported


def adamw8bit(params, **kwargs) -> torch.optim.Optimizer:
    """torchao's AdamW8bit (its state, its update), stepped eagerly a slice
    of SLICE elements at a time instead of compiled (See Note [Why torchao,
    not bitsandbytes]). Same arguments as torchao.optim.AdamW8bit."""
    if not _EAGER:
        _EAGER.append(_eager_class())
    return _EAGER[0](params, **kwargs)


def _eager_class():
    base, single, state_class = _adamw8bit_base()

    class AdamW8bit(base):
        def step(self, closure=None):
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            self._meta_slices = set()  # each step its own (See Note [Repeated slices on meta])
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            self._update(p, group)
            return loss

        def _update(self, p, group):
            state = self.state[p]
            if len(state) == 0:
                state["step"] = torch.tensor(0.0, device=p.device)
                state["exp_avg"] = self._new_buffer(p, True)
                state["exp_avg_sq"] = self._new_buffer(p, False)
            state["step"] += 1
            n = p.numel()
            flat_p, flat_g = p.detach().view(-1), p.grad.view(-1)
            for start in range(0, n, SLICE):
                stop = min(n, start + SLICE)
                if p.is_meta and self._seen_on_meta(p, stop - start, state):
                    continue  # See Note [Repeated slices on meta]

                def update(start=start, stop=stop):
                    single(flat_p[start:stop], flat_g[start:stop], state["step"],
                           _slice_state(state["exp_avg"], start, stop, state_class),
                           _slice_state(state["exp_avg_sq"], start, stop, state_class), None,
                           group["lr"], group["betas"][0], group["betas"][1],
                           group["weight_decay"], group["eps"], True, False)

                if p.is_meta:  # See Note [Replayed on meta]
                    replayed_on_meta(("adamw8bit", self._slice_key(p, stop - start, state),
                                      type(group["lr"])), update)
                else:
                    update()

        @staticmethod
        def _slice_key(p, n, state):
            return (n, p.dtype, p.grad.dtype, _state_key(state["exp_avg"]),
                    _state_key(state["exp_avg_sq"]))

        def _seen_on_meta(self, p, n, state):
            # The slice's temporaries start from the live bytes where the
            # same slice already ran: the same rise and fall again.
            key = (self._slice_key(p, n, state), _memfit.tracked_live_bytes("meta"))
            if key in self._meta_slices:
                return True
            self._meta_slices.add(key)
            return False

    return AdamW8bit


def _state_key(s):
    return (type(s).__name__, getattr(s, "block_size", None), s.dtype)
