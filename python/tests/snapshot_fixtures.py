"""Synthetic CUDA memory snapshots, written in the format torch documents
(torch/cuda/memory.py _snapshot(); torch/cuda/_memory_viz.py reads it), for
the tests of `memfit explain`. Every file written here is synthetic: made by
these builders, not by a GPU, and never cited as a card's truth.

- SnapshotBuilder: trace entries written one by one with the addresses and
  sizes a test chooses; the `segments` list (the allocator's state at the
  dump) follows from them, as the real allocator's would.
- training_step(): a plausible step (parameters, forward, loss, backward,
  Adam) with frames like a real run's, every size chosen by the test.
- write_streamed_snapshot(): a large file written without holding it in
  memory (for the bounded-memory check).

Like torch's writer, the stack a block was allocated with is the very list
object its alloc entry holds (pickle writes it once and refers back), and
Python frames are new dicts per stack.
"""

import io
import os
import pickle
import struct
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = [
    "MiB",
    "SnapshotBuilder",
    "TORCH",
    "allocator_rules_trace",
    "frames",
    "stack",
    "training_step",
    "write_streamed_snapshot",
]

MiB = 1 << 20
TORCH = "/opt/venv/lib/python3.11/site-packages/torch"


def frames(*specs: Tuple[str, int, str]) -> List[dict]:
    """A stack as torch writes it: innermost call first."""
    return [{"filename": f, "line": line, "name": name} for f, line, name in specs]


def _round512(n: int) -> int:
    return max(512, (n + 511) // 512 * 512)


class SnapshotBuilder:
    """Trace entries in the order the test writes them; segments() is the
    allocator state they leave."""

    def __init__(self, device: int = 0):
        self.device = device
        self.trace: List[dict] = []
        self.time_us = 1_000_000
        # segment address -> {"size", "stream", "blocks": {addr: (size, requested, frames)}}
        self.live_segments: Dict[int, dict] = {}
        self.pre_segments: List[dict] = []  # segments made before recording

    def _entry(self, action, addr, size, stream=0, frames_=None, **extra):
        self.time_us += 10
        e = {"action": action, "addr": addr, "size": size, "stream": stream,
             "time_us": self.time_us, "frames": frames_ if frames_ is not None else []}
        e.update(extra)
        self.trace.append(e)
        return e

    def segment_alloc(self, addr: int, size: int, stream: int = 0, record: bool = True):
        self.live_segments[addr] = {"size": size, "stream": stream, "blocks": {},
                                    "expandable": False}
        if record:
            self._entry("segment_alloc", addr, size, stream)

    def segment_free(self, addr: int):
        seg = self.live_segments.pop(addr)
        assert not seg["blocks"], "a segment with live blocks cannot be freed"
        self._entry("segment_free", addr, seg["size"], seg["stream"])

    def _segment_of(self, addr):
        for saddr, seg in self.live_segments.items():
            if saddr <= addr < saddr + seg["size"]:
                return seg
        raise AssertionError(f"address {addr:#x} is in no live segment")

    def alloc(self, addr: int, size: int, frames_=None, stream: int = 0,
              block_size: Optional[int] = None, record: bool = True):
        """An allocation of `size` bytes at `addr` (a block of `block_size`,
        default the request rounded to 512 B)."""
        stack = frames_ if frames_ is not None else []
        seg = self._segment_of(addr)
        seg["blocks"][addr] = (block_size or _round512(size), size, stack)
        if record:
            self._entry("alloc", addr, size, stream, stack)

    def free(self, addr: int, stream: int = 0, frames_=None, completed: bool = True):
        seg = self._segment_of(addr)
        _, requested, _ = seg["blocks"].pop(addr)
        self._entry("free_requested", addr, requested, stream, frames_)
        if completed:
            self._entry("free_completed", addr, requested, stream, frames_)

    def oom(self, size: int, device_free: int, frames_=None, stream: int = 0):
        self.time_us += 10
        self.trace.append({"action": "oom", "device_free": device_free, "size": size,
                           "stream": stream, "time_us": self.time_us,
                           "frames": frames_ if frames_ is not None else []})

    def segments(self) -> List[dict]:
        out = []
        for saddr in sorted(self.live_segments):
            seg = self.live_segments[saddr]
            blocks, at = [], saddr
            for baddr in sorted(seg["blocks"]):
                bsize, requested, stack = seg["blocks"][baddr]
                if baddr > at:
                    blocks.append({"address": at, "size": baddr - at, "requested_size": 0,
                                   "state": "inactive", "frames": []})
                blocks.append({"address": baddr, "size": bsize, "requested_size": requested,
                               "state": "active_allocated", "frames": stack})
                at = baddr + bsize
            end = saddr + seg["size"]
            if at < end:
                blocks.append({"address": at, "size": end - at, "requested_size": 0,
                               "state": "inactive", "frames": []})
            used = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
            out.append({
                "device": self.device, "address": saddr, "total_size": seg["size"],
                "allocated_size": used, "active_size": used,
                "requested_size": sum(b["requested_size"] for b in blocks),
                "stream": seg["stream"],
                "segment_type": "small" if seg["size"] == 2 * MiB else "large",
                "segment_pool_id": (0, 0), "is_expandable": seg["expandable"],
                "frames": [], "blocks": blocks,
            })
        return out

    def snapshot(self, devices: int = 1) -> dict:
        traces = [[] for _ in range(devices)]
        traces[self.device] = self.trace
        return {
            "segments": self.segments(),
            "device_traces": traces,
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                   "garbage_collection_threshold": 0.0,
                                   "expandable_segments": False,
                                   "roundup_power2_divisions": {}},
            "external_annotations": [],
        }

    def write(self, path, protocol: int = pickle.DEFAULT_PROTOCOL) -> str:
        with open(path, "wb") as f:
            pickle.dump(self.snapshot(), f, protocol=protocol)
        return str(path)


# --- A training step, as frames would show it -------------------------------

MODEL = "/home/user/proj/model.py"
TRAIN = "/home/user/proj/train.py"


def _module_call(inner: List[tuple], line: int) -> List[tuple]:
    return inner + [(f"{TORCH}/nn/modules/module.py", 1773, "_call_impl"),
                    (f"{TORCH}/nn/modules/module.py", 1762, "_wrapped_call_impl"),
                    (MODEL, line, "forward"),
                    (f"{TORCH}/nn/modules/module.py", 1773, "_call_impl"),
                    (f"{TORCH}/nn/modules/module.py", 1762, "_wrapped_call_impl"),
                    (TRAIN, 30, "train_step")]


STACKS = {
    "parameters": [(f"{TORCH}/nn/modules/module.py", 1341, "convert"),
                   (f"{TORCH}/nn/modules/module.py", 930, "_apply"),
                   (f"{TORCH}/nn/modules/module.py", 1355, "to"),
                   (TRAIN, 12, "<module>")],
    "inputs": [(TRAIN, 28, "train_step")],
    "forward_fc1": _module_call([(f"{TORCH}/nn/modules/linear.py", 125, "forward")], 41),
    "forward_fc2": _module_call([(f"{TORCH}/nn/modules/linear.py", 125, "forward")], 43),
    "forward_tmp": _module_call([(f"{TORCH}/nn/functional.py", 1700, "relu")], 42),
    "loss": [(f"{TORCH}/nn/functional.py", 3494, "cross_entropy"), (TRAIN, 31, "train_step")],
    # The autograd engine's device thread runs no Python: no Python frames.
    "backward": [],
    "backward_main": [(f"{TORCH}/autograd/graph.py", 829, "_engine_run_backward"),
                      (f"{TORCH}/autograd/__init__.py", 354, "backward"),
                      (f"{TORCH}/_tensor.py", 647, "backward"),
                      (TRAIN, 32, "train_step")],
    "adam_state": [(f"{TORCH}/optim/adam.py", 176, "_init_group"),
                   (f"{TORCH}/optim/adam.py", 246, "step"),
                   (f"{TORCH}/optim/optimizer.py", 516, "wrapper"),
                   (TRAIN, 33, "train_step")],
    "adam_tmp": [(f"{TORCH}/optim/adam.py", 640, "_multi_tensor_adam"),
                 (f"{TORCH}/optim/adam.py", 260, "step"),
                 (f"{TORCH}/optim/optimizer.py", 516, "wrapper"),
                 (TRAIN, 33, "train_step")],
    "zero_grad": [(f"{TORCH}/optim/optimizer.py", 1000, "zero_grad"), (TRAIN, 34, "train_step")],
}


def stack(name: str) -> List[dict]:
    return frames(*STACKS[name])


def training_step(builder: Optional[SnapshotBuilder] = None, iterations: int = 2,
                  grads_kept: bool = False, unit: int = 10 * MiB) -> SnapshotBuilder:
    """A two-layer model's steps with Adam, sizes in multiples of `unit` u
    (>= 10 MiB and a multiple of 2 MiB, so each request is a block of
    exactly its size in a segment of exactly its size: the numbers the tests
    expect are sums of what is written here). A request takes a cached free
    segment of its size if there is one, else a new one; the 4-byte gradient
    seed of backward (torch.ones_like(loss), made by the main thread) takes
    a 2 MiB small segment.

    Parameters 2u (made once). Per iteration: input 1u; forward: fc1's
    output 2u and fc2's 1u (kept), a relu temporary 1u (freed at once);
    loss 1u; backward: the 4-byte seed, gradients 1u + 1u (kept), a
    temporary 3u (freed); then the activations, loss, input and seed are
    freed; Adam: state 4 x 1u on its first step, a temporary 2u; zero_grad
    frees the gradients (grads_kept: they live on, through the next forward,
    and are freed just before its backward).

    Live bytes peak in iteration 2's backward at its temporary: params 2u +
    state 4u + input 1u + activations 3u + loss 1u + grads 2u + temp 3u =
    16u, + the 4-byte seed. Segments: 16u of large ones (the second
    iteration's loss and grads need new ones: the first's are held by Adam's
    state) and one small 2 MiB. This policy is simpler than the caching
    allocator's (which would split the free 3u block for the second loss):
    the replay's tests use allocator_rules_trace().
    """
    b = builder or SnapshotBuilder()
    u = unit
    free_segments: Dict[int, List[int]] = {}  # segment size -> cached free segments
    next_addr = [0x7F0000000000]
    owner: Dict[str, Tuple[int, int]] = {}

    def alloc(name, size, stack_name):
        seg = 2 * MiB if size <= MiB else size
        cached = free_segments.get(seg)
        if cached:
            addr = cached.pop()
        else:
            addr = next_addr[0]
            next_addr[0] += seg + 64 * MiB
            b.segment_alloc(addr, seg)
        b.alloc(addr, size, stack(stack_name))
        owner[name] = (addr, seg)

    def free(name, stack_name=None):
        addr, seg = owner.pop(name)
        b.free(addr, frames_=stack(stack_name) if stack_name else None)
        free_segments.setdefault(seg, []).append(addr)

    alloc("fc1.weight", u, "parameters")
    alloc("fc2.weight", u, "parameters")
    for it in range(iterations):
        alloc("x", u, "inputs")
        alloc("h1", 2 * u, "forward_fc1")
        alloc("relu_tmp", u, "forward_tmp")
        free("relu_tmp")
        alloc("out", u, "forward_fc2")
        alloc("loss", u, "loss")
        if grads_kept and it > 0:
            free("g1", "zero_grad")  # zeroed just before backward
            free("g2", "zero_grad")
        alloc("seed", 4, "backward_main")
        alloc("g2", u, "backward")
        alloc("g1", u, "backward")
        alloc("bw_tmp", 3 * u, "backward")
        free("bw_tmp")
        for name in ("h1", "out", "loss", "x", "seed"):
            free(name)
        if it == 0:
            for i in range(4):
                alloc(f"adam{i}", u, "adam_state")
        alloc("adam_tmp", 2 * u, "adam_tmp")
        free("adam_tmp")
        if not grads_kept:
            free("g1", "zero_grad")
            free("g2", "zero_grad")
    return b


def allocator_rules_trace() -> SnapshotBuilder:
    """A trace whose segments follow the CUDA caching allocator's documented
    rules (/work/shared/ANCHORS.md; c10/cuda/CUDACachingAllocator.cpp), built
    by hand for a few chosen sizes:

    1. 1000 B: a 2 MiB small segment A; its block 1024 B (512 B rounding).
    2. 3000 B: the rest of A (small blocks split when >= 512 B remain): 3072.
    3. 3 MiB: a 20 MiB large segment B (under 10 MiB), split: 3 MiB + 17 MiB.
    4. 16.5 MiB: the 17 MiB rest of B, not split (0.5 MiB left, not > 1 MiB).
    5. 11 MiB: a segment C of 12 MiB (>= 10 MiB: rounded up to 2 MiB), not
       split (1 MiB left).
    6. free 3; then 2 MiB: the free 3 MiB block, not split (1 MiB left).
    7. 1000 B on another stream: A's free rest is stream 0's: a new small D.
    8. free 5; the allocator gives C back (a run of segment_free: what
       release_cached_blocks does when cudaMalloc fails, or empty_cache()).
    9. 5 MiB: no free large block: a new 20 MiB segment E.
    Reserved: 2, 22, 34, 36, 24, 44 MiB (the peak); at the dump the
    segments are A, B, D (2, 20, 2 MiB) and E (20 MiB).
    """
    b = SnapshotBuilder()
    A, B, C, D, E = (0x10000000, 0x20000000, 0x30000000, 0x40000000, 0x50000000)
    fwd = stack("forward_fc1")
    b.segment_alloc(A, 2 * MiB)
    b.alloc(A, 1000, fwd)
    b.alloc(A + 1024, 3000, fwd)
    b.segment_alloc(B, 20 * MiB)
    b.alloc(B, 3 * MiB, fwd)
    b.alloc(B + 3 * MiB, 16 * MiB + MiB // 2, fwd, block_size=17 * MiB)
    b.segment_alloc(C, 12 * MiB)
    b.alloc(C, 11 * MiB, fwd, block_size=12 * MiB)
    b.free(B)
    b.alloc(B, 2 * MiB, fwd, block_size=3 * MiB)
    b.segment_alloc(D, 2 * MiB, stream=7)
    b.alloc(D, 1000, fwd, stream=7)
    b.free(C)
    b.segment_free(C)
    b.segment_alloc(E, 20 * MiB)
    b.alloc(E, 5 * MiB, fwd)
    return b


# --- A large file, streamed --------------------------------------------------

class _StreamWriter:
    """Pickle opcodes of protocol 4 for plain data, written as they come.
    Objects passed to share() are memoized and referred back to while they
    are shared; everything else is memoized too (as pickle does: the memo
    indices grow, so back-references are 5-byte LONG_BINGETs as in a real
    file) but never referred to again."""

    def __init__(self, f):
        self.f = f
        self.n = 0  # memo size
        self.shared: Dict[int, int] = {}  # id -> memo index, once written
        self.held: Dict[int, object] = {}  # keeps shared objects (and their ids) alive
        f.write(b"\x80\x04")

    def share(self, o):
        self.held[id(o)] = o

    def encoded(self, o):
        """(bytes, memo entries) of `o` as obj() would write it: written
        again and again with replay(), as pickle writes equal but distinct
        objects."""
        f, self.f = self.f, io.BytesIO()
        n = self.n
        try:
            self.obj(o)
            return self.f.getvalue(), self.n - n
        finally:
            self.f, self.n = f, n

    def replay(self, blob):
        self.f.write(blob[0])
        self.n += blob[1]

    def unshare(self, o):
        self.held.pop(id(o), None)
        self.shared.pop(id(o), None)

    def _memoize(self, o):
        self.f.write(b"\x94")
        if id(o) in self.held:
            self.shared[id(o)] = self.n
        self.n += 1

    def obj(self, o):
        w = self.f.write
        idx = self.shared.get(id(o))
        if idx is not None:
            w(b"h" + bytes([idx]) if idx < 256 else b"j" + struct.pack("<I", idx))
            return
        t = type(o)
        if t is str:
            data = o.encode()
            w((b"\x8c" + bytes([len(data)])) if len(data) < 256
              else b"X" + struct.pack("<I", len(data)))
            w(data)
            self._memoize(o)
        elif t is bool:
            w(b"\x88" if o else b"\x89")
        elif t is int:
            if 0 <= o < 256:
                w(b"K" + bytes([o]))
            elif 0 <= o < 65536:
                w(b"M" + struct.pack("<H", o))
            elif -(2 ** 31) <= o < 2 ** 31:
                w(b"J" + struct.pack("<i", o))
            else:
                data = o.to_bytes((o.bit_length() + 8) // 8, "little", signed=True)
                w(b"\x8a" + bytes([len(data)]) + data)
        elif o is None:
            w(b"N")
        elif t is float:
            w(b"G" + struct.pack(">d", o))
        elif t is tuple:
            w(b"(")
            for x in o:
                self.obj(x)
            w(b"t")
            self._memoize(o)
        elif t is dict:
            w(b"}")
            self._memoize(o)
            items = list(o.items())
            for i in range(0, len(items), 1000):
                w(b"(")
                for k, v in items[i:i + 1000]:
                    self.obj(k)
                    self.obj(v)
                w(b"u")
        elif t is list:
            w(b"]")
            self._memoize(o)
            for i in range(0, len(o), 1000):
                w(b"(")
                for x in o[i:i + 1000]:
                    self.obj(x)
                w(b"e")
        else:
            raise TypeError(t)


def write_streamed_snapshot(path, target_bytes: int, python_frames: int = 12,
                            cpp_frames: int = 20) -> dict:
    """A synthetic snapshot of about `target_bytes`: a recorded 512 MiB
    segment whose 4 MiB slots are allocated and freed in turn (alloc,
    free_requested, free_completed), each alloc with `python_frames` fresh
    Python frame dicts and `cpp_frames` shared C++ ones (the free entries
    refer back to their alloc's stack), written without building it in
    memory. Returns what was written: events, allocs, the peak of live
    bytes, the segment's size."""
    seg_addr, seg_size, block = 0x7F0000000000, 512 * MiB, 4 * MiB
    request = block - 512
    n_slots = seg_size // block
    written = {"events": 0, "allocs": 0, "peak_allocated": 0, "segment": seg_size}
    with open(path, "wb") as f:
        w = _StreamWriter(f)
        keys = ["action", "addr", "size", "stream", "time_us", "frames", "filename", "line",
                "name", "alloc", "free_requested", "free_completed", "segment_alloc"]
        cpp = [{"filename": f"/pytorch/aten/src/ATen/native/op_{i}.cpp", "line": 100 + i,
                "name": f"at::native::op_{i}(at::Tensor const&, c10::Scalar const&)"}
               for i in range(64)]
        for o in keys + cpp:
            w.share(o)
        f.write(b"}")
        w._memoize({})
        f.write(b"(")  # the top dict's items
        w.obj("segments")
        # The allocator at the dump: the segment, every block freed.
        w.obj([{"device": 0, "address": seg_addr, "total_size": seg_size, "stream": 0,
                "segment_type": "large", "allocated_size": 0, "active_size": 0,
                "requested_size": 0, "is_expandable": False, "frames": [],
                "blocks": [{"address": seg_addr, "size": seg_size, "requested_size": 0,
                            "state": "inactive", "frames": []}]}])
        w.obj("device_traces")
        f.write(b"]")
        w._memoize([])
        f.write(b"(")  # device_traces' items: one device
        f.write(b"]")
        w._memoize([])
        f.write(b"(")  # the device's entries, in batches of 1000
        t, batch, live, i = 1, 0, 0, 0

        py_frames = {}  # (file, line) -> the encoded frame dict

        def frame(key):
            blob = py_frames.get(key)
            if blob is None:
                blob = py_frames[key] = w.encoded(
                    {"filename": f"/home/user/proj/layer_{key[0]}.py", "line": 10 + key[1],
                     "name": "forward" if key[1] % 3 == 0 else "_call_impl"})
            w.replay(blob)

        def stack_list(stack_):
            """A list of frames: C++ frame dicts (shared) and Python ones,
            (file, line) keys written as fresh dicts each time."""
            idx = w.shared.get(id(stack_))
            if idx is not None:
                w.obj(stack_)  # a back-reference
                return
            f.write(b"]")
            w._memoize(stack_)
            f.write(b"(")
            for x in stack_:
                if type(x) is tuple:
                    frame(x)
                else:
                    w.obj(x)
            f.write(b"e")

        def entry(action, addr, size, stack_):
            nonlocal t, batch
            t += 3
            f.write(b"}")
            w._memoize(None)
            f.write(b"(")
            for k, v in (("action", action), ("addr", addr), ("size", size), ("stream", 0),
                         ("time_us", t)):
                w.obj(k)
                w.obj(v)
            w.obj("frames")
            stack_list(stack_)
            f.write(b"u")
            written["events"] += 1
            batch += 1
            if batch == 1000:
                f.write(b"e(")
                batch = 0

        entry("segment_alloc", seg_addr, seg_size, [])
        slots = [None] * n_slots
        while f.tell() < target_bytes:
            s = i % n_slots
            addr = seg_addr + s * block
            if slots[s] is not None:
                entry("free_requested", addr, request, slots[s])
                entry("free_completed", addr, request, slots[s])
                w.unshare(slots[s])
                live -= request
            stack_ = [cpp[(i + j) % len(cpp)] for j in range(cpp_frames)]
            stack_ += [((i + j) % 50, j) for j in range(python_frames)]
            w.share(stack_)
            entry("alloc", addr, request, stack_)
            written["allocs"] += 1
            live += request
            written["peak_allocated"] = max(written["peak_allocated"], live)
            slots[s] = stack_
            i += 1
        for s, stack_ in enumerate(slots):
            if stack_ is not None:
                entry("free_requested", seg_addr + s * block, request, stack_)
                entry("free_completed", seg_addr + s * block, request, stack_)
        f.write(b"e")  # the device's last batch
        f.write(b"e")  # the device into device_traces
        f.write(b"u.")  # the top dict's items; STOP
    written["bytes"] = os.path.getsize(path)
    return written
