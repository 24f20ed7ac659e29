#include "memfit/core/render/html_report.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "memfit/core/model/units.h"
#include "memfit/core/render/report_text.h"
#include "training_step.h"

namespace memfit {
namespace {

using testing::count;
using testing::kMiB;
using testing::training_step;

std::string attribute(const std::string& tag, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const size_t at = tag.find(key);
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size();
  return tag.substr(begin, tag.find('"', begin) - begin);
}

struct Shown {
  int64_t bytes = 0;
  std::string text;
};

// Every byte count the page shows: data-field -> data-bytes and its text.
std::map<std::string, Shown> shown_bytes(const std::string& html) {
  std::map<std::string, Shown> out;
  for (size_t pos = html.find("<span class=\"bytes\"");
       pos != std::string::npos;
       pos = html.find("<span class=\"bytes\"", pos + 1)) {
    const size_t close = html.find('>', pos);
    const std::string tag = html.substr(pos, close - pos);
    const std::string text =
        html.substr(close + 1, html.find("</span>", close) - close - 1);
    out[attribute(tag, "data-field")] =
        Shown{std::stoll(attribute(tag, "data-bytes")), text};
  }
  return out;
}

// The report's value at a data-field path under "report.".
int64_t report_value(const Report& r, const std::string& field) {
  auto index = [&](const std::string& prefix) {
    return std::stoul(field.substr(prefix.size()));
  };
  auto member = [&](const std::string& f) {
    return f.substr(f.rfind('.') + 1);
  };
  if (field == "report.peak_bytes") return r.peak_bytes;
  if (field.rfind("report.phases.", 0) == 0) {
    const PhaseRow& p = r.phases.at(index("report.phases."));
    const std::string m = member(field);
    if (m == "live_bytes_after") return p.live_after;
    if (m == "delta_bytes") return p.delta_bytes;
    if (m == "peak_bytes") return p.peak_bytes;
  }
  if (field.rfind("report.categories_at_peak.", 0) == 0) {
    return r.categories_at_peak[static_cast<int>(
        category_from_string(member(field)))];
  }
  if (field.rfind("report.modules.", 0) == 0) {
    return r.modules.at(index("report.modules.")).activation_bytes;
  }
  ADD_FAILURE() << "unknown field " << field;
  return -1;
}

Report step_report(const Timeline& t) {
  return make_report(t, ReportInputs{"gpt", 16, "adam", "cpu"});
}

TEST(HtmlReportTest, EveryByteCountShownIsTheReportsJson) {
  const Timeline t = training_step();
  const Report r = step_report(t);
  const std::string html = html_report(r, t);
  const auto shown = shown_bytes(html);
  size_t from_report = 0;
  for (const auto& [field, s] : shown) {
    if (field.rfind("report.", 0) != 0) continue;
    ++from_report;
    EXPECT_EQ(s.bytes, report_value(r, field)) << field;
    EXPECT_TRUE(s.text == format_bytes(s.bytes) ||
                s.text == "+" + format_bytes(s.bytes))
        << field << ": " << s.text;
  }
  // peak, 3 numbers per phase, categories, modules
  size_t categories = 0;
  for (int64_t b : r.categories_at_peak) categories += b != 0;
  EXPECT_EQ(from_report,
            1 + 3 * r.phases.size() + categories + r.modules.size());
  // The JSON the numbers came from is in the page, whole.
  EXPECT_NE(html.find("{\"report\":" + to_json(r, false) + ",\"peak\":"),
            std::string::npos);
}

TEST(HtmlReportTest, ThePeakIsAnnotatedInThePictureAndTheFigures) {
  const Timeline t = training_step();
  const std::string html = html_report(step_report(t), t);
  EXPECT_NE(html.find(">peak 29.53 MiB in backward 2 at "
                      "aten::_log_softmax_backward_data</text>"),
            std::string::npos);
  EXPECT_NE(
      html.find(">activations 16.00 MiB, optimizer state 6.00 MiB</text>"),
      std::string::npos);
  EXPECT_NE(html.find(">modules: head 8.00 MiB, blocks.0 6.00 MiB</text>"),
            std::string::npos);
  const auto shown = shown_bytes(html);
  EXPECT_EQ(shown.at("peak.categories.0.bytes").bytes, 16 * kMiB + 8);
  EXPECT_EQ(shown.at("peak.modules.0.bytes").bytes, 8 * kMiB);
  EXPECT_EQ(shown.at("peak.modules.1.bytes").bytes, 6 * kMiB);
}

TEST(HtmlReportTest, IsOneSelfContainedFile) {
  const Timeline t = training_step();
  const std::string html = html_report(step_report(t), t);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(html.substr(html.size() - 8), "</html>\n");
  for (const char* external :
       {"src=", "href=", "<link", "@import", "url(", "https:"}) {
    EXPECT_EQ(count(html, external), 0u) << external;
  }
  // http: only as the SVG namespace, which is a name, not a fetch.
  EXPECT_EQ(count(html, "http:"),
            count(html, "\"http://www.w3.org/2000/svg\""));
  EXPECT_EQ(count(html, "<svg"), 2u);  // the stacked plot and the module bars
  EXPECT_EQ(count(html, "<script"), 2u);  // the data and the hover
  for (const char* section :
       {"id=\"timeline\"", "id=\"modules\"", "id=\"phases\"",
        "id=\"categories\"", "id=\"notes\""}) {
    EXPECT_EQ(count(html, section), 1u) << section;
  }
}

TEST(HtmlReportTest, JsonInsideTheScriptCannotEndIt) {
  const Timeline t = training_step();
  Report r = step_report(t);
  r.model = "</script><script>alert(1)</script>";
  const std::string html = html_report(r, t);
  EXPECT_EQ(count(html, "</script>"), 2u);
  EXPECT_NE(html.find("\"model\":\"<\\/script><script>alert(1)<\\/script>\""),
            std::string::npos);
  EXPECT_NE(
      html.find("<h1>memfit profile: &lt;/script&gt;&lt;script&gt;alert(1)"
                "&lt;/script&gt;, batch 16, adam</h1>"),
      std::string::npos);
}

// A peak model of one phase, backward: 10 MiB + 1.5 MiB a sample, probed at
// `probes` (each probe's peak what the model predicts there).
PeakModel backward_peak_model(std::vector<int64_t> probes) {
  PeakModel pm;
  pm.mode = "cpu";
  pm.probe_batches = std::move(probes);
  PhaseFit f;
  f.phase = "backward";
  f.fit.m0 = 10.0 * kMiB;
  f.fit.per_sample = 1.5 * kMiB;
  pm.phases = {f};
  for (int64_t b : pm.probe_batches) pm.probe_peaks.push_back(pm.predict(b));
  return pm;
}

TEST(HtmlReportTest, PredictionAndAdviceWhenGiven) {
  const Timeline t = training_step();
  const Report r = step_report(t);
  HtmlReportOptions o;
  o.budget = 256 * kMiB;
  const PeakModel pm = backward_peak_model({4, 8, 16});
  o.prediction = pm;
  AdviceTable a;
  a.budget_bytes = 9 * kMiB;
  a.plain_peak_bytes = 12 * kMiB;
  a.rows.push_back({"baseline", 12 * kMiB, 0, 1.0, false, "same"});
  a.rows.push_back({"checkpoint every layer (2 of 2)", 8 * kMiB, 4 * kMiB, 1.31,
                    true, "same"});
  a.plan = "checkpoint blocks 0,1";
  o.advice = a;
  const std::string html = html_report(r, t, o);
  EXPECT_EQ(count(html, "<svg"), 3u);
  EXPECT_EQ(count(html, "id=\"prediction\""), 1u);
  EXPECT_EQ(count(html, "id=\"advice\""), 1u);
  const auto shown = shown_bytes(html);
  EXPECT_EQ(shown.at("prediction.predicted_peak_bytes").bytes, pm.predict(16));
  EXPECT_EQ(shown.at("prediction.max_batch_peak_bytes").bytes, pm.predict(164));
  EXPECT_EQ(shown.at("prediction.probes.1.peak_bytes").bytes, pm.predict(8));
  EXPECT_EQ(shown.at("advice.rows.1.peak_bytes").bytes, 8 * kMiB);
  EXPECT_EQ(shown.at("advice.rows.1.saving_bytes").bytes, 4 * kMiB);
  EXPECT_NE(html.find("<span data-field=\"prediction.max_batch\">164</span>"),
            std::string::npos);
  EXPECT_NE(html.find("\"max_batch\":164"), std::string::npos);
  EXPECT_NE(html.find("<td>checkpoint every layer (2 of 2)</td>"),
            std::string::npos);
  EXPECT_NE(html.find("<b>plan:</b> checkpoint blocks 0,1</p>"),
            std::string::npos);
  EXPECT_EQ(html.find("a card reserves more"), std::string::npos);
  // For a card, the page says the curve is allocated bytes.
  Report on_card = r;
  on_card.cuda = estimate_cuda(t, kDefaultCudaWorkspaceBytes);
  const std::string card_html = html_report(on_card, t, o);
  EXPECT_NE(card_html.find("(allocated bytes: a card reserves more)"), std::string::npos);
  EXPECT_NE(card_html.find("in allocated bytes (a card reserves more: memfit fit --target cuda"),
            std::string::npos);
  // Without them, neither section.
  const std::string plain = html_report(r, t);
  EXPECT_EQ(count(plain, "id=\"prediction\""), 0u);
  EXPECT_EQ(count(plain, "id=\"advice\""), 0u);
  EXPECT_NE(plain.find("\"prediction\":null,\"advice\":null}"),
            std::string::npos);
}

TEST(HtmlReportTest, TheBatchProfiledIsOnePredictedRowWhenItIsTheLargestThatFits) {
  const Timeline t = training_step();
  const Report r = step_report(t);  // batch 16
  const PeakModel pm = backward_peak_model({4, 8});
  HtmlReportOptions o;
  o.prediction = pm;
  o.budget = pm.predict(16) + kMiB;  // 16 fits, 17 does not
  const std::string html = html_report(r, t, o);
  EXPECT_EQ(count(html, "<td>predicted: "), 1u);
  EXPECT_NE(html.find("<td>predicted: the batch profiled, the largest batch within the budget "
                      "of "),
            std::string::npos);
}

}  // namespace
}  // namespace memfit
