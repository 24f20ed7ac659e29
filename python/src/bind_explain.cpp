// `memfit explain`: reading a CUDA memory snapshot, replaying its allocator
// trace, building a Timeline of its events, and the built-in models'
// prediction beside it. Glue only: the logic is in the core headers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "memfit/core/model/allocator_model.h"
#include "memfit/core/model/allocator_trace.h"
#include "memfit/core/model/card_kernels.h"
#include "memfit/core/model/snapshot_events.h"
#include "memfit/core/model/snapshot_reader.h"
#include "memfit/core/model/timeline.h"
#include "memfit/torch/models.h"
#include "memfit/torch/profile.h"

namespace py = pybind11;

namespace memfit::python {
namespace {

template <typename T>
py::bytes column(const std::vector<T>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// A buffer (array.array, bytes) of `n` items of T.
template <typename T>
const T* items(const py::buffer& b, size_t n, const char* what) {
  py::buffer_info info = b.request();
  if (static_cast<size_t>(info.size * info.itemsize) != n * sizeof(T)) {
    throw std::invalid_argument(std::string("[explain] column ") + what + " holds " +
                                std::to_string(info.size * info.itemsize) + " bytes, expected " +
                                std::to_string(n * sizeof(T)));
  }
  return static_cast<const T*>(info.ptr);
}

size_t count(const py::buffer& b) { return static_cast<size_t>(b.request().size); }

template <typename T>
std::vector<T> to_vector(const py::buffer& b, size_t n, const char* what) {
  const T* p = items<T>(b, n, what);
  return std::vector<T>(p, p + n);
}

py::dict snapshot_dict(Snapshot&& s) {
  py::list frames;
  for (const auto& f : s.frames) frames.append(py::make_tuple(f.filename, f.line, f.name));
  py::list stacks;
  for (const auto& st : s.stacks) stacks.append(py::tuple(py::cast(st)));
  py::list segments;
  for (const auto& seg : s.segments) {
    py::list blocks;
    for (const auto& b : seg.blocks) {
      blocks.append(py::make_tuple(b.address, b.size, b.requested_size, b.state, b.stack));
    }
    py::dict d;
    d["device"] = seg.device;
    d["address"] = seg.address;
    d["total_size"] = seg.total_size;
    d["stream"] = seg.stream;
    d["segment_type"] = seg.segment_type;
    d["allocated_size"] = seg.allocated_size;
    d["active_size"] = seg.active_size;
    d["is_expandable"] = seg.is_expandable;
    d["blocks"] = blocks;
    segments.append(d);
  }
  py::list traces;
  for (const auto& t : s.traces) {
    py::dict d;
    d["action"] = column(t.action);
    d["addr"] = column(t.addr);
    d["size"] = column(t.size);
    d["stream"] = column(t.stream);
    d["time_us"] = column(t.time_us);
    d["stack"] = column(t.stack);
    traces.append(d);
  }
  py::dict out;
  out["segments"] = segments;
  out["traces"] = traces;
  out["has_traces"] = s.has_traces;
  out["frames"] = frames;
  out["stacks"] = stacks;
  out["allocator_settings"] = s.allocator_settings;
  out["unknown_actions"] = s.unknown_actions;
  return out;
}

}  // namespace

void init_explain(py::module_& m) {
  py::register_exception<SnapshotFormatError>(m, "SnapshotFormatError", PyExc_ValueError);

  py::list actions;
  for (int a = 0; a < kNumTraceActions; ++a) actions.append(to_string(static_cast<TraceAction>(a)));
  m.attr("SNAPSHOT_ACTIONS") = py::tuple(actions);

  m.def("read_snapshot", [](const std::string& path) {
    Snapshot s;
    {
      py::gil_scoped_release no_gil;
      s = read_snapshot(path);
    }
    return snapshot_dict(std::move(s));
  }, py::arg("path"),
     "The snapshot at `path` read in bounded memory: segments, per device the "
     "trace's columns as bytes (action u8, addr u64, size i64, stream i64, "
     "time_us i64, stack u32), frames (filename, line, name), stacks (frame "
     "indices, innermost first). Raises SnapshotFormatError (a ValueError) "
     "with one line for a file that is not a snapshot.");

  m.def("replay_allocator_ops", [](const py::buffer& kinds, const py::buffer& ids,
                                   const py::buffer& bytes, const py::buffer& streams) {
    const size_t n = count(kinds);
    const auto* k = items<uint8_t>(kinds, n, "kinds");
    const auto* id = items<uint64_t>(ids, n, "ids");
    const auto* b = items<int64_t>(bytes, n, "bytes");
    const auto* s = items<int64_t>(streams, n, "streams");
    std::vector<AllocatorOp> ops(n);
    for (size_t i = 0; i < n; ++i) ops[i] = allocator_op(k[i], id[i], b[i], s[i]);
    AllocatorReplay r;
    {
      py::gil_scoped_release no_gil;
      r = replay_allocator_ops(ops);
    }
    return py::make_tuple(column(r.reserved), column(r.allocated), r.segments, r.num_ooms);
  }, py::arg("kinds"), py::arg("ids"), py::arg("bytes"), py::arg("streams"),
     "memfit's caching-allocator replay over ops (kind 0 malloc, 1 free, 2 release "
     "the cache): (reserved after each op as i64 bytes, allocated likewise, the "
     "segment sizes at the end, OOMs).");

  m.def("timeline_from_events", [](const py::buffer& kinds, const py::buffer& bytes,
                                   const py::buffer& ids, const py::buffer& times_ns,
                                   const py::buffer& categories, const py::buffer& modules,
                                   const std::vector<std::string>& module_names,
                                   const std::vector<SpanStart>& spans) {
    const size_t n = count(kinds);
    EventColumns ev;
    ev.kinds = to_vector<uint8_t>(kinds, n, "kinds");
    ev.bytes = to_vector<int64_t>(bytes, n, "bytes");
    ev.ids = to_vector<uint64_t>(ids, n, "ids");
    ev.times_ns = to_vector<int64_t>(times_ns, n, "times_ns");
    ev.categories = to_vector<uint8_t>(categories, n, "categories");
    ev.modules = to_vector<uint32_t>(modules, n, "modules");
    return timeline_from_events(ev, module_names, spans);
  }, py::arg("kinds"), py::arg("bytes"), py::arg("ids"), py::arg("times_ns"),
     py::arg("categories"), py::arg("modules"), py::arg("module_names"), py::arg("spans"),
     "A CUDA Timeline from event columns (kind u8: 0 alloc, 1 free; bytes i64; "
     "id u64; time_ns i64; category u8 in Category order; module u32 into "
     "module_names) and phase spans (first event, name, iteration).");

  m.attr("SNAPSHOT_WORKSPACE_SIZES") = py::tuple(py::cast(snapshot_workspace_sizes()));
  m.def("snapshot_events", [](const py::buffer& action, const py::buffer& addr,
                              const py::buffer& size, const py::buffer& stream,
                              const py::buffer& time_us, const py::buffer& stack,
                              int64_t reserved_at_dump,
                              const std::vector<std::tuple<uint64_t, int64_t, uint32_t>>& live,
                              std::vector<std::string> stack_phase,
                              std::vector<std::string> stack_place) {
    const size_t n = count(action);
    SnapshotTrace t;
    t.action = to_vector<uint8_t>(action, n, "action");
    t.addr = to_vector<uint64_t>(addr, n, "addr");
    t.size = to_vector<int64_t>(size, n, "size");
    t.stream = to_vector<int64_t>(stream, n, "stream");
    t.time_us = to_vector<int64_t>(time_us, n, "time_us");
    t.stack = to_vector<uint32_t>(stack, n, "stack");
    SnapshotEventsInput in;
    in.reserved_at_dump = reserved_at_dump;
    for (const auto& [a, b, s] : live) in.live_at_dump.push_back({a, b, s});
    in.stack_phase = std::move(stack_phase);
    in.stack_place = std::move(stack_place);
    SnapshotEvents e;
    {
      py::gil_scoped_release no_gil;
      e = snapshot_events(t, in);
    }
    py::list ooms;
    for (const auto& o : e.ooms) {
      ooms.append(py::make_tuple(o.trace_index, o.size, o.device_free, o.stream, o.stack,
                                 o.events_before, o.reserved));
    }
    py::dict d;
    d["timeline"] = std::move(e.timeline);
    d["trace_index"] = column(e.trace_index);
    d["reserved_after"] = column(e.reserved_after);
    d["stacks"] = column(e.stacks);
    d["peak_reserved_bytes"] = e.peak_reserved_bytes;
    d["peak_reserved_trace_index"] = e.peak_reserved_trace_index;
    d["reserved_at_start"] = e.reserved_at_start;
    d["allocated_at_start"] = e.allocated_at_start;
    d["pre_existing"] = e.pre_existing;
    d["ooms"] = ooms;
    d["spans"] = e.spans;
    d["phase_of_alloc"] = e.phase_of_alloc;
    d["notes"] = e.notes;
    d["expandable"] = e.expandable;
    return d;
  }, py::arg("action"), py::arg("addr"), py::arg("size"), py::arg("stream"),
     py::arg("time_us"), py::arg("stack"), py::arg("reserved_at_dump"), py::arg("live_at_dump"),
     py::arg("stack_phase"), py::arg("stack_place"),
     "One device's trace (its columns as read_snapshot gives them) as memfit events, "
     "in one walk (core/model/snapshot_events.h): a dict of the Timeline, per event "
     "trace_index and reserved_after (i64 bytes), per allocation its stack (u32 bytes), "
     "the reserved peak and start, what was live before the trace, ooms (trace index, "
     "size, device_free, stream, stack, events before, reserved), spans, phase_of_alloc, "
     "notes, expandable. live_at_dump: (address, bytes, stack) of the blocks active at the "
     "dump; stack_phase and stack_place: per stack, what its frames say (\"\": nothing).");

  m.def("profile_builtin", [](const std::string& model, int64_t batch,
                              const std::string& optimizer, int iterations,
                              int64_t cuda_workspace) {
    ProfileOptions o;
    o.batch = batch;
    o.optimizer = optimizer;
    o.iterations = iterations;
    o.cuda_target = true;
    o.cuda_workspace = cuda_workspace;
    py::gil_scoped_release no_gil;
    auto m = make_model(model);
    Profile p = profile_model(*m, o);
    return std::make_pair(std::move(p.report), std::move(p.timeline));
  }, py::arg("model"), py::arg("batch"), py::arg("optimizer") = "adam",
     py::arg("iterations") = 2, py::arg("cuda_workspace") = kDefaultCudaWorkspaceBytes,
     "A built-in model's step (`memfit profile --model M --batch B --target cuda`) "
     "recorded on the CPU: (Report with its CUDA estimate, Timeline).");

  m.def("cudnn_conv_backward_workspace", [](int64_t x_numel, int64_t dy_numel,
                                            int64_t w_numel) {
    return cudnn_conv_backward_workspace({x_numel, dy_numel, w_numel});
  }, py::arg("x_numel"), py::arg("dy_numel"), py::arg("w_numel"),
     "The bound of a convolution's backward workspaces on a card, from its input's, "
     "output gradient's and weight's elements (Note [cuDNN's convolution workspace]).");
  m.def("cuda_segment_size", [](int64_t bytes) {
    return cuda_segment_size(cuda_round_size(bytes));
  }, py::arg("bytes"),
     "The segment the caching allocator cudaMallocs for a request of `bytes` no cached "
     "block serves: the most one request can add to the reserved bytes.");
  m.def("cuda_workspace_allocated", &cuda_workspace_allocated, py::arg("workspace_bytes"),
        "Of a card's fixed workspace bytes, those counted as allocated: all but the free half "
        "of cuBLASLt's small segment (Note [cuBLASLt's block in the replay]).");
  m.def("cuda_workspace_held", &cuda_workspace_held, py::arg("workspace_bytes"),
        "Of a card's fixed workspace bytes, those the replay holds aside: all but "
        "cuBLASLt's 2 MiB segment, whose 1 MiB block it allocates before the forward.");
  m.attr("CUBLASLT_WORKSPACE") = kCublasLtWorkspaceBytes;
  m.def("cuda_reserved_after", [](const Timeline& timeline, int64_t workspace_bytes) {
    std::vector<int64_t> after;
    {
      py::gil_scoped_release no_gil;
      after = cuda_reserved_after(timeline, workspace_bytes);
    }
    return column(after);
  }, py::arg("timeline"), py::arg("workspace_bytes"),
     "The reserved bytes after each of the timeline's events as memfit's CUDA estimate "
     "replays them (i64 bytes; the held-aside workspace not included, cuBLASLt's block "
     "from the forward on: Note [cuBLASLt's block in the replay]).");
  m.def("cuda_ooms_under", [](const Timeline& timeline, int64_t capacity, int64_t workspace_bytes) {
    py::gil_scoped_release no_gil;
    return replay_cuda(timeline, capacity, workspace_bytes).num_ooms;
  }, py::arg("timeline"), py::arg("capacity"), py::arg("workspace_bytes"),
     "How many of the timeline's allocations run out of memory when memfit's CUDA estimate "
     "replays them on a card of `capacity` bytes (the workspace held aside as in the "
     "estimate): a caching allocator that cannot cudaMalloc releases its wholly free "
     "segments and tries again, so a step can run in less than its unbounded peak reserved.");
  m.def("cudnn_workspace_note", [](const Timeline& timeline, const std::vector<int64_t>& bounds,
                                   int64_t batch) {
    ConvWorkspaceAtPeak w = cudnn_workspace_at_peak(timeline, bounds);
    w.batch = batch;
    return cudnn_workspace_note(w);
  }, py::arg("timeline"), py::arg("bounds"), py::arg("batch") = 0,
     "The note a CUDA target's report carries on cuDNN's workspaces: `timeline` a card "
     "rehearsal's (its convolutions' forwards and backwards marked), `bounds` "
     "each mark's workspace bound in order (Note [cuDNN's workspace at the step's "
     "peak]); \"\" for none.");
  m.def("cudnn_workspace_in_notes", &cudnn_workspace_in_notes, py::arg("notes"),
        "The bytes a CUDA target's report says cuDNN's workspaces can add to its peak "
        "(Note [cuDNN's workspace at the step's peak]); -1 where no convolution was "
        "recorded for a card.");
}

}  // namespace memfit::python
