// Events per second for Timeline recording (the hot path: every tensor
// allocation) and for its analyses. Reports items_per_second = events/s.
#include <benchmark/benchmark.h>

#include <cstdint>

#include "memfit/core/model/timeline.h"

namespace memfit {
namespace {

// A steady state of `window` live allocations: each allocation after the
// first `window` is preceded by the free of the oldest one.
Timeline make_timeline(int64_t num_events, int64_t window, bool reserve) {
  Timeline t;
  if (reserve) t.reserve(static_cast<size_t>(num_events));
  const uint32_t module = t.module_index("model.layers.0.mlp");
  const uint32_t op = t.op_index("aten::mm");
  Event e;
  e.module = module;
  e.op = op;
  e.device = Device::kCUDA;
  e.category = Category::kActivation;
  uint64_t next = 0;
  for (int64_t n = 0; n < num_events;) {
    if (next % 100000 == 0) {
      t.begin_phase(next % 200000 == 0 ? "forward" : "backward",
                    static_cast<int>(next / 200000));
    }
    if (static_cast<int64_t>(next) >= window) {
      e.kind = EventKind::kFree;
      e.id = next - static_cast<uint64_t>(window);
      e.time_ns = n;
      e.phase = t.current_phase();
      t.record(e);
      if (++n == num_events) break;
    }
    e.kind = EventKind::kAlloc;
    e.id = next;
    e.bytes = 4096 + static_cast<int64_t>(next % 64) * 512;
    e.time_ns = n;
    e.phase = t.current_phase();
    t.record(e);
    ++n;
    ++next;
  }
  t.end_phase();
  return t;
}

void BM_Record(benchmark::State& state) {
  const int64_t n = state.range(0);
  for (auto _ : state) {
    Timeline t = make_timeline(n, 10000, /*reserve=*/false);
    benchmark::DoNotOptimize(t.size());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_Record)->Arg(2000000)->Unit(benchmark::kMillisecond);

void BM_RecordReserved(benchmark::State& state) {
  const int64_t n = state.range(0);
  for (auto _ : state) {
    Timeline t = make_timeline(n, 10000, /*reserve=*/true);
    benchmark::DoNotOptimize(t.size());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_RecordReserved)->Arg(2000000)->Unit(benchmark::kMillisecond);

void BM_Peak(benchmark::State& state) {
  const Timeline t = make_timeline(state.range(0), 10000, true);
  for (auto _ : state) {
    benchmark::DoNotOptimize(t.peak());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Peak)->Arg(2000000)->Unit(benchmark::kMillisecond);

void BM_BreakdownAtPeak(benchmark::State& state) {
  const Timeline t = make_timeline(state.range(0), 10000, true);
  const size_t at = t.size() - 1;  // the worst case: every event scanned
  for (auto _ : state) {
    benchmark::DoNotOptimize(t.breakdown_after(at));
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_BreakdownAtPeak)->Arg(2000000)->Unit(benchmark::kMillisecond);

void BM_PhaseSummaries(benchmark::State& state) {
  const Timeline t = make_timeline(state.range(0), 10000, true);
  for (auto _ : state) {
    benchmark::DoNotOptimize(t.phase_summaries());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_PhaseSummaries)->Arg(2000000)->Unit(benchmark::kMillisecond);

void BM_Curve2000(benchmark::State& state) {
  const Timeline t = make_timeline(state.range(0), 10000, true);
  for (auto _ : state) {
    benchmark::DoNotOptimize(t.curve(2000));
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Curve2000)->Arg(2000000)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace memfit

BENCHMARK_MAIN();
