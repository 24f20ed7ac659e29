#include "memfit/core/render/html_report.h"

#include <cmath>
#include <cstdio>
#include <string_view>

#include "html_report_assets.h"  // generated: kHtmlStyle, kHtmlScript

#include "memfit/core/model/units.h"
#include "memfit/core/render/json_writer.h"
#include "memfit/core/render/module_bars.h"
#include "memfit/core/render/prediction_plot.h"
#include "memfit/core/render/report_text.h"
#include "memfit/core/render/svg_plot.h"

namespace memfit {
namespace {

constexpr int kWidth = 1200;

std::string esc(std::string_view s) { return xml_escape(s); }

std::string signed_bytes(int64_t b) {
  return (b > 0 ? "+" : "") + format_bytes(b);
}

// A byte count shown on the page. See Note [The page's numbers are the
// JSON's].
std::string bytes_html(const std::string& field, int64_t bytes,
                       bool with_sign = false, const char* tag = "span") {
  return std::string("<") + tag + " class=\"bytes\" data-field=\"" +
         esc(field) + "\" data-bytes=\"" + std::to_string(bytes) +
         "\" title=\"" + std::to_string(bytes) + " B\">" +
         esc(with_sign ? signed_bytes(bytes) : format_bytes(bytes)) + "</" +
         tag + ">";
}

std::string td_bytes(const std::string& field, int64_t bytes,
                     bool with_sign = false) {
  return "<td class=\"num\">" + bytes_html(field, bytes, with_sign) + "</td>";
}

std::string td(std::string_view text, const char* cls = nullptr) {
  return std::string("<td") +
         (cls ? std::string(" class=\"") + cls + "\"" : "") + ">" + esc(text) +
         "</td>";
}

std::string report_ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", r);
  return buf;
}

std::string percent(int64_t part, int64_t whole) {
  char buf[32];
  std::snprintf(
      buf, sizeof buf, "%.1f%%",
      whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole)
                : 0.0);
  return buf;
}

// JSON inside <script>: "</" would end the element early.
std::string script_safe(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  for (size_t i = 0; i < json.size(); ++i) {
    out += json[i];
    if (json[i] == '<' && i + 1 < json.size() && json[i + 1] == '/')
      out += '\\';
  }
  return out;
}

std::string peak_json(const PeakSummary& s) {
  JsonWriter w;
  w.begin_object()
      .member("bytes", s.bytes)
      .member("phase", s.phase)
      .member("iteration", s.iteration)
      .member("op", s.op);
  for (const char* key : {"categories", "modules"}) {
    w.key(key).begin_array();
    for (const NamedBytes& n :
         std::string_view(key) == "categories" ? s.categories : s.modules) {
      w.begin_object()
          .member("name", n.name)
          .member("bytes", n.bytes)
          .end_object();
    }
    w.end_array();
  }
  w.end_object();
  return w.str();
}

std::string plot_json(const StackedPlot& p) {
  JsonWriter w;
  w.begin_object()
      .member("width", p.options.width)
      .member("height", p.options.height)
      .member("x_axis", to_string(p.x_axis));
  w.key("area")
      .begin_object()
      .member("x", p.area.x)
      .member("y", p.area.y)
      .member("w", p.area.w)
      .member("h", p.area.h)
      .end_object();
  w.key("categories").begin_array();
  for (int c = 0; c < kNumCategories; ++c) {
    w.begin_object()
        .member("name", to_string(static_cast<Category>(c)))
        .member("label", category_label(static_cast<Category>(c)))
        .member("color", category_color(static_cast<Category>(c)))
        .end_object();
  }
  w.end_array();
  w.key("stack_order").begin_array();
  for (Category c : kStackOrder) w.value(static_cast<int>(c));
  w.end_array();
  w.key("bands").begin_array();
  for (const PhaseBand& b : p.bands) {
    w.begin_object()
        .member("phase", b.phase)
        .member("iteration", b.iteration)
        .member("x", b.box.x)
        .member("w", b.box.w)
        .member("label", b.label)
        .end_object();
  }
  w.end_array();
  // [x, event index (-1: the start), time_ns, bytes by Category...]
  w.key("points").begin_array();
  for (const PlotPoint& pt : p.points) {
    w.begin_array()
        .value(std::round(pt.x * 10) / 10)
        .value(pt.event_index == kNoEvent
                   ? int64_t{-1}
                   : static_cast<int64_t>(pt.event_index))
        .value(pt.time_ns);
    for (int64_t b : pt.bytes) w.value(b);
    w.end_array();
  }
  w.end_array();
  w.end_object();
  return w.str();
}

std::string prediction_json(const PeakModel& pm, const PredictionPlot& p) {
  JsonWriter w;
  w.begin_object().member("mode", pm.mode);
  w.key("probes").begin_array();
  for (const auto& [b, bytes] : p.probes) {
    w.begin_object()
        .member("batch", b)
        .member("peak_bytes", bytes)
        .end_object();
  }
  w.end_array();
  if (p.options.batch > 0) {
    w.member("batch", p.options.batch)
        .member("predicted_peak_bytes", pm.predict(p.options.batch));
  }
  if (p.options.budget > 0) {
    w.member("budget_bytes", p.options.budget).member("max_batch", p.max_batch);
    if (p.max_batch > 0) {
      w.member("max_batch_peak_bytes", pm.predict(p.max_batch));
    }
  }
  w.member("max_rel_residual", pm.max_rel_residual());
  w.end_object();
  return w.str();
}

std::string advice_json(const AdviceTable& a) {
  JsonWriter w;
  w.begin_object()
      .member("budget_bytes", a.budget_bytes)
      .member("plain_peak_bytes", a.plain_peak_bytes)
      .member("plan", a.plan);
  w.key("rows").begin_array();
  for (const AdviceRow& r : a.rows) {
    w.begin_object()
        .member("name", r.name)
        .member("peak_bytes", r.peak_bytes)
        .member("saving_bytes", r.saving_bytes)
        .member("time_ratio", r.time_ratio);
    if (r.fits) {
      w.member("fits", *r.fits);
    } else {
      w.key("fits").null();
    }
    w.member("result", r.result).member("predicted", r.predicted).end_object();
  }
  w.end_array();
  w.key("notes").begin_array();
  for (const auto& n : a.notes) w.value(n);
  w.end_array();
  w.end_object();
  return w.str();
}

std::string card(const std::string& label, const std::string& value_html,
                 const std::string& detail) {
  return "<div class=\"card\"><div class=\"card-label\">" + esc(label) +
         "</div><div class=\"card-value\">" + value_html +
         "</div><div class=\"card-detail\">" + esc(detail) + "</div></div>\n";
}

// The head, the title and the line under it.
std::string page_top(const Report& r, const std::string& title) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
         "<meta name=\"viewport\" content=\"width=device-width, "
         "initial-scale=1\">\n"
         "<title>" +
         esc(title) + "</title>\n<style>" + std::string(detail::kHtmlStyle) +
         "</style>\n</head>\n<body>\n<main>\n" + "<h1>" + esc(title) + "</h1>\n" +
         "<p class=\"summary\">model " + esc(r.model) +
         (r.batch > 0 ? ", batch " + std::to_string(r.batch) : std::string()) +  // 0: unknown
         ", optimizer " + esc(r.optimizer) + ", mode " + esc(r.mode) + "</p>\n";
}

// The cards: the peak, the largest category at it, the parameters, and the
// largest batch under the budget when the prediction has one.
std::string key_figures(const Report& r, const StackedPlot& plot,
                        const std::optional<PredictionPlot>& pp, int64_t budget) {
  std::string h = "<div class=\"cards\">\n";
  std::string where = "in " + r.peak_phase + " (iteration " +
                      std::to_string(r.peak_iteration) + ")";
  if (!r.peak_op.empty()) where += " at " + r.peak_op;
  h += card("peak", bytes_html("report.peak_bytes", r.peak_bytes), where);
  if (!plot.peak.categories.empty()) {
    const NamedBytes& top = plot.peak.categories.front();
    h += card("largest at the peak: " + top.name,
              bytes_html("peak.categories.0.bytes", top.bytes),
              percent(top.bytes, r.peak_bytes) + " of the peak");
  }
  const int64_t params =
      r.categories_at_peak[static_cast<int>(Category::kParameter)];
  h += card("parameters",
            bytes_html("report.categories_at_peak.parameter", params),
            percent(params, r.peak_bytes) + " of the peak");
  if (pp && budget > 0) {
    h += card("largest batch under " + format_bytes(budget) +
                  (r.cuda ? " in allocated bytes (a card reserves more: memfit fit --target "
                            "cuda fits its reserve)"
                          : ""),
              "<span data-field=\"prediction.max_batch\">" +
                  (pp->max_batch >= kMaxBatch ? std::string("any")
                                              : std::to_string(pp->max_batch)) +
                  "</span>",
              "predicted from probes at small batches");
  }
  return h + "</div>\n";
}

// The stacked timeline and the module bars.
std::string pictures(const StackedPlot& plot, const ModuleBars& bars) {
  return "<section id=\"timeline\">\n<h2>What filled memory, and when</h2>\n"
         "<div class=\"figure\" id=\"stacked\">\n" +
         plot.svg() +
         "</div>\n<p class=\"hint\">Hover the plot for the exact bytes of each "
         "category at that moment; the phases are shaded and named above it.</p>\n"
         "</section>\n" +
         "<section id=\"modules\">\n<h2>Which layer to checkpoint</h2>\n"
         "<div class=\"figure\">\n" +
         bars.svg() +
         "</div>\n<p class=\"hint\">What each module's forward kept alive for "
         "backward (at the end of the first forward). Hover a bar for its exact "
         "bytes.</p>\n</section>\n";
}

std::string phases_section(const Report& r) {
  std::string h =
      "<section id=\"phases\">\n<h2>Phases</h2>\n<table>\n<thead><tr><th>phase"
      "</th><th class=\"num\">iter</th><th class=\"num\">live after</th><th "
      "class=\"num\">delta</th><th class=\"num\">peak</th><th>why</th></tr>"
      "</thead>\n<tbody>\n";
  for (size_t i = 0; i < r.phases.size(); ++i) {
    const PhaseRow& p = r.phases[i];
    const std::string f = "report.phases." + std::to_string(i) + ".";
    h += "<tr>" + td(p.name) + td(std::to_string(p.iteration), "num") +
         td_bytes(f + "live_bytes_after", p.live_after) +
         td_bytes(f + "delta_bytes", p.delta_bytes, true) +
         td_bytes(f + "peak_bytes", p.peak_bytes) + td(p.note, "note") +
         "</tr>\n";
  }
  return h + "</tbody>\n</table>\n</section>\n";
}

// The categories at the peak, and the modules holding the most there.
std::string peak_section(const Report& r, const PeakSummary& peak) {
  std::string h =
      "<section id=\"categories\">\n<h2>At the peak</h2>\n<table>\n<thead><tr>"
      "<th>category</th><th class=\"num\">bytes</th><th class=\"num\">share"
      "</th></tr></thead>\n<tbody>\n";
  for (int c = 0; c < kNumCategories; ++c) {
    const int64_t b = r.categories_at_peak[c];
    if (b == 0) continue;
    const std::string name(to_string(static_cast<Category>(c)));
    h += "<tr>" + td(name) + td_bytes("report.categories_at_peak." + name, b) +
         td(percent(b, r.peak_bytes), "num") + "</tr>\n";
  }
  h += "</tbody>\n</table>\n";
  if (!peak.modules.empty()) {
    h += "<p>Modules holding the most at the peak (any category): ";
    for (size_t i = 0; i < peak.modules.size() && i < 5; ++i) {
      h += (i ? ", " : "") + esc(peak.modules[i].name) + " " +
           bytes_html("peak.modules." + std::to_string(i) + ".bytes",
                      peak.modules[i].bytes);
    }
    h += "</p>\n";
  }
  return h + "</section>\n";
}

std::string module_table_section(const Report& r) {
  if (r.modules.empty()) return "";
  std::string h =
      "<section id=\"module-table\">\n<h2>Activations saved, every module"
      "</h2>\n<table>\n<thead><tr><th>module</th><th class=\"num\">"
      "activations saved</th></tr></thead>\n<tbody>\n";
  for (size_t i = 0; i < r.modules.size(); ++i) {
    h += "<tr>" + td(r.modules[i].path) +
         td_bytes("report.modules." + std::to_string(i) + ".activation_bytes",
                  r.modules[i].activation_bytes) +
         "</tr>\n";
  }
  return h + "</tbody>\n</table>\n</section>\n";
}

std::string cuda_section(const CudaEstimate& cuda) {
  return "<section id=\"cuda\">\n<h2>On a CUDA device</h2>\n<p>The caching "
         "allocator replayed: " +
         bytes_html("report.cuda.peak_allocated_bytes", cuda.peak_allocated) +
         " allocated, " +
         bytes_html("report.cuda.peak_reserved_bytes", cuda.peak_reserved) +
         " reserved at the peak (workspaces " +
         bytes_html("report.cuda.workspace_bytes", cuda.workspace_bytes) +
         ").</p>\n</section>\n";
}

std::string data_parallel_section(const DataParallelEstimate& dp, int64_t peak_bytes) {
  std::string h = "<section id=\"data-parallel\">\n<h2>Per rank on " +
                  std::to_string(dp.setup.world_size) +
                  " ranks</h2>\n<table>\n<thead><tr><th>sharding</th><th class=\"num\">"
                  "peak</th><th class=\"num\">vs 1 process</th><th>where</th><th>rule"
                  "</th></tr></thead>\n<tbody>\n";
  for (size_t i = 0; i < dp.per_rank.size(); ++i) {
    const RankPeak& rp = dp.per_rank[i];
    h += "<tr>" + td(to_string(rp.sharding)) +
         td_bytes("report.data_parallel.per_rank." + std::to_string(i) + ".peak_bytes",
                  rp.peak_bytes) +
         td(report_ratio(static_cast<double>(rp.peak_bytes) /
                  static_cast<double>(std::max<int64_t>(peak_bytes, 1))),
            "num") +
         td(rp.phase + " " + std::to_string(rp.iteration)) + td(rp.formula, "note") +
         "</tr>\n";
  }
  return h + "</tbody>\n</table>\n</section>\n";
}

// The peak over batch sizes: the curve, the probes, the batch profiled and
// the largest under the budget.
std::string prediction_section(const Report& r, const PeakModel& model,
                               const PredictionPlot& pp, int64_t budget) {
  std::string h = "<section id=\"prediction\">\n<h2>The peak at other batch sizes</h2>\n"
                  "<div class=\"figure\">\n" +
                  pp.svg() +
                  "</div>\n<table>\n<thead><tr>"
                  "<th class=\"num\">batch</th><th class=\"num\">peak</th><th>from</th>"
                  "</tr></thead>\n<tbody>\n";
  for (size_t i = 0; i < pp.probes.size(); ++i) {
    h += "<tr>" + td(std::to_string(pp.probes[i].first), "num") +
         td_bytes("prediction.probes." + std::to_string(i) + ".peak_bytes",
                  pp.probes[i].second) +
         td("measured (" + model.mode + " probe)") + "</tr>\n";
  }
  // The batch profiled, said once where it is also the largest within the
  // budget (two "predicted" rows of one batch read as a repeat).
  const bool largest = budget > 0 && pp.max_batch > 0;
  const std::string within = "the largest batch within the budget of " + format_bytes(budget);
  const bool same = largest && pp.max_batch == r.batch;
  h += "<tr>" + td(std::to_string(r.batch), "num") +
       td_bytes("prediction.predicted_peak_bytes", model.predict(r.batch)) +
       td("predicted: the batch profiled" + (same ? ", " + within : std::string())) + "</tr>\n";
  if (largest && !same) {
    h += "<tr>" + td(std::to_string(pp.max_batch), "num") +
         td_bytes("prediction.max_batch_peak_bytes", model.predict(pp.max_batch)) +
         td("predicted: " + within) + "</tr>\n";
  }
  return h + "</tbody>\n</table>\n</section>\n";
}

std::string advice_section(const AdviceTable& a) {
  std::string h = "<section id=\"advice\">\n<h2>When it does not fit: each strategy, "
                  "measured</h2>\n<p>Plain step: peak " +
                  bytes_html("advice.plain_peak_bytes", a.plain_peak_bytes);
  if (a.budget_bytes > 0) {
    h += "; budget " + bytes_html("advice.budget_bytes", a.budget_bytes);
  }
  h += ".</p>\n<table>\n<thead><tr><th>strategy</th><th class=\"num\">peak"
       "</th><th class=\"num\">saving</th><th class=\"num\">time</th><th>fits"
       "</th><th>result</th></tr></thead>\n<tbody>\n";
  for (size_t i = 0; i < a.rows.size(); ++i) {
    const AdviceRow& row = a.rows[i];
    const std::string f = "advice.rows." + std::to_string(i) + ".";
    h += "<tr>" + td(row.name) +
         (row.predicted ? "<td class=\"num\">~" + bytes_html(f + "peak_bytes", row.peak_bytes) +
                              "</td>"
                        : td_bytes(f + "peak_bytes", row.peak_bytes)) +
         td_bytes(f + "saving_bytes", row.saving_bytes) +
         td(report_ratio(row.time_ratio), "num") +
         td(row.fits ? (*row.fits ? "yes" : "no") : "-") + td(row.result) +
         "</tr>\n";
  }
  h += "</tbody>\n</table>\n<p><b>plan:</b> " + esc(a.plan) + "</p>\n";
  if (!a.notes.empty()) {
    h += "<ul class=\"notes\">\n";
    for (const auto& n : a.notes) h += "<li>" + esc(n) + "</li>\n";
    h += "</ul>\n";
  }
  return h + "</section>\n";
}

std::string notes_section(const Report& r, PlotAxis x_axis) {
  std::string h = "<section id=\"notes\">\n<h2>Notes</h2>\n<ul class=\"notes\">\n";
  h += "<li>Bytes are what the step's tensors hold (" + esc(r.mode) +
       " mode), counted by memfit's allocator hooks; the plot's x axis is " +
       (x_axis == PlotAxis::kTime ? std::string("wall time") : std::string("event order")) +
       ".</li>\n";
  for (const auto& n : r.notes) h += "<li>" + esc(n) + "</li>\n";
  return h + "</ul>\n</section>\n";
}

// The end of the page: the tooltip, the JSON every byte on the page is read
// from (Note [The page's numbers are the JSON's]) and the hover script.
std::string page_bottom(const std::string& data) {
  return "</main>\n<div id=\"tip\" hidden></div>\n"
         "<script type=\"application/json\" id=\"memfit-data\">" +
         script_safe(data) + "</script>\n<script>" + std::string(detail::kHtmlScript) +
         "</script>\n</body>\n</html>\n";
}

}  // namespace

std::string html_report(const Report& r, const Timeline& t,
                        const HtmlReportOptions& o) {
  const std::string title =
      o.title.empty() ? "memfit profile: " + r.model + ", batch " +
                            std::to_string(r.batch) + ", " + r.optimizer
                      : o.title;
  StackedPlotOptions so;
  so.title = "Memory by category over the step";
  so.width = kWidth;
  so.x_axis = o.x_axis;
  const StackedPlot plot = stacked_plot(t, so);
  ModuleBarsOptions mo;
  mo.width = kWidth;
  const ModuleBars bars = module_bars(r.modules, mo);
  std::optional<PredictionPlot> pp;
  if (o.prediction) {
    PredictionPlotOptions po;
    po.width = kWidth;
    po.batch = r.batch;
    po.budget = o.budget;
    // For a card the curve is still allocated bytes, under what the caching
    // allocator reserves: the page must not promise a card that batch.
    if (r.cuda) po.title = "Predicted peak by batch size (allocated bytes: a card reserves more)";
    pp = prediction_plot(*o.prediction, po);
  }

  std::string h = page_top(r, title) + key_figures(r, plot, pp, o.budget) +
                  pictures(plot, bars) + phases_section(r) + peak_section(r, plot.peak) +
                  module_table_section(r);
  if (r.cuda) h += cuda_section(*r.cuda);
  if (r.data_parallel) h += data_parallel_section(*r.data_parallel, r.peak_bytes);
  if (pp) h += prediction_section(r, *o.prediction, *pp, o.budget);
  if (o.advice) h += advice_section(*o.advice);
  h += notes_section(r, plot.x_axis);
  return h + page_bottom("{\"report\":" + to_json(r, false) + ",\"peak\":" +
                         peak_json(plot.peak) + ",\"plot\":" + plot_json(plot) +
                         ",\"prediction\":" +
                         (pp ? prediction_json(*o.prediction, *pp) : std::string("null")) +
                         ",\"advice\":" + (o.advice ? advice_json(*o.advice) : "null") + "}");
}

}  // namespace memfit
