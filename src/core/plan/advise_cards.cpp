// "What fits on which card": advise's plan for several budgets at once.
#include <algorithm>
#include <stdexcept>
#include <utility>

#include "memfit/core/model/units.h"
#include "memfit/core/plan/advise_plan.h"

namespace memfit {

// Note [What fits on which card]
// A person choosing a card asks one question for several budgets: which of
// 8, 12, ... 80 GiB runs this step, and how. The answer is the planner's
// own choice (See Note [How advise plans]) made once per budget: its order
// of preference is the order of least change (the plain step, then the
// least recompute, then the state on the host, the settings that keep the
// result, then, with allow_approximate, the front's settings in its order:
// closest to full fine-tuning first) and, within one variant, the largest
// micro-batch. The budgets share every recording: the front's record is
// asked once per (variant, batch, cheap), and each later budget reuses it,
// so the cards cost little more than the largest search among them.
// Cards are planned smallest first; each gets its own AdvisePlan, found or
// not (then its peak is the closest the search came).

namespace {

// The front's measurer, each recording asked for once.
class CachedMeasurer {
 public:
  explicit CachedMeasurer(const AdviseMeasurer& m) : m_(m) {
    cached_.record = [this](const StepVariant& v, int64_t batch, bool cheap) {
      for (const auto& e : entries_) {
        if (e.batch == batch && e.cheap == cheap && e.variant == v &&
            e.variant.setting_exact == v.setting_exact)
          return e.step;
      }
      VariantRecording r = m_.record(v, batch, cheap);
      entries_.push_back({v, batch, cheap, r});
      return r;
    };
    cached_.estimate_ratio = m.estimate_ratio;
    cached_.estimated_from = m.estimated_from;
  }
  // Times only the first budget's plan (the others are estimated).
  AdviseMeasurer with_timing() const {
    AdviseMeasurer out = cached_;
    out.time_ratio = m_.time_ratio;
    return out;
  }
  const AdviseMeasurer& measurer() const { return cached_; }

 private:
  struct Entry {
    StepVariant variant;
    int64_t batch;
    bool cheap;
    VariantRecording step;
  };
  const AdviseMeasurer& m_;
  AdviseMeasurer cached_;
  std::vector<Entry> entries_;
};

}  // namespace

Advice plan_cards(const AdviseMeasurer& measurer, const AdviseSettings& settings) {
  for (int64_t b : settings.cards) {
    if (b <= 0) {
      throw std::invalid_argument("[advise] a card's budget must be > 0 bytes, got " +
                                  std::to_string(b));
    }
  }
  std::vector<int64_t> cards = settings.cards;
  std::sort(cards.begin(), cards.end());
  cards.erase(std::unique(cards.begin(), cards.end()), cards.end());
  CachedMeasurer cached(measurer);
  AdviseSettings one = settings;
  one.cards.clear();
  Advice main = plan_advice(cached.with_timing(), one);
  int recordings = main.recordings;
  for (int64_t b : cards) {
    AdviseSettings s = one;
    s.budget = b;
    const std::string label = format_bytes(b);
    if (settings.progress.enabled()) {
      s.progress = Progress([p = settings.progress, label](const std::string& line) {
        p.step("card " + label + ": " + line.substr(line.find(']') + 2));
      });
    }
    const Advice a = plan_advice(cached.measurer(), s);
    recordings += a.recordings;
    main.cards.push_back({b, a.plan});
  }
  main.recordings = recordings;
  return main;
}

}  // namespace memfit
