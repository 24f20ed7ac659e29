"""The HTML page of a profiled step, from `memfit profile --html`
and from memfit.report.page.save_html: rendered by a real headless browser
(Debian's chromium) without errors, every number it shows equal to the
JSON's, no label over another as the browser draws them, and the hover on
the timeline giving the exact bytes of the peak."""

import html
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import memfit
from memfit.report import page as report_page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed, so the page cannot be rendered in a headless browser: "
    "install Debian's chromium (apt-get install chromium; scripts/install_deps.sh does as root)",
)
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
GPT = ["--model", "gpt", "--layers", "2", "--width", "128", "--context", "64"]

# Put first in <head>: every error the page raises, any console.error, and
# any resource that fails to load (there must be none to load).
COLLECTOR = """<script>
window.__errors = [];
window.addEventListener("error", function (e) {
  window.__errors.push(e.message ? e.message : "failed to load " + (e.target && e.target.outerHTML));
}, true);
window.addEventListener("unhandledrejection", function (e) {
  window.__errors.push("unhandled rejection: " + e.reason);
});
(function () {
  var original = console.error;
  console.error = function () {
    window.__errors.push(Array.prototype.join.call(arguments, " "));
    original.apply(console, arguments);
  };
})();
</script>"""

# Put last in <body>, after the page's own scripts ran: what the browser
# shows, written into the DOM for --dump-dom.
CHECKER = """<script>
(function () {
  var out = {errors: window.__errors, fields: [], overlaps: [], outside: [], svgs: 0};
  try {
    document.querySelectorAll("[data-field]").forEach(function (el) {
      out.fields.push({field: el.getAttribute("data-field"),
                       bytes: el.getAttribute("data-bytes"), text: el.textContent});
    });
    document.querySelectorAll("svg").forEach(function (svg, k) {
      out.svgs++;
      var w = svg.viewBox.baseVal.width, h = svg.viewBox.baseVal.height;
      var texts = Array.prototype.slice.call(svg.querySelectorAll("text"));
      var boxes = texts.map(function (t) { return t.getBBox(); });
      for (var i = 0; i < boxes.length; i++) {
        var a = boxes[i];
        if (a.x < 0 || a.y < 0 || a.x + a.width > w || a.y + a.height > h) {
          out.outside.push([k, texts[i].textContent]);
        }
        for (var j = i + 1; j < boxes.length; j++) {
          var b = boxes[j];
          if (a.x < b.x + b.width && b.x < a.x + a.width &&
              a.y < b.y + b.height && b.y < a.y + a.height) {
            out.overlaps.push([k, texts[i].textContent, texts[j].textContent]);
          }
        }
      }
    });
    // Hover over the peak's point of the stacked plot.
    var data = JSON.parse(document.getElementById("memfit-data").textContent);
    var plot = data.plot, svg = document.querySelector("#stacked svg");
    var total = function (p) { var s = 0; for (var k = 3; k < p.length; k++) s += p[k]; return s; };
    var best = 0;
    plot.points.forEach(function (p, i) { if (total(p) > total(plot.points[best])) best = i; });
    var r = svg.getBoundingClientRect();
    var x = r.left + (plot.points[best][0] + 0.01) * r.width / plot.width;
    svg.dispatchEvent(new MouseEvent("mousemove", {clientX: x, clientY: r.top + r.height / 2,
                                                   bubbles: true}));
    var tip = document.getElementById("tip");
    out.hover = {visible: !tip.hidden, categories: {}, total: null};
    tip.querySelectorAll("tr[data-category]").forEach(function (tr) {
      out.hover.categories[tr.getAttribute("data-category")] = Number(tr.getAttribute("data-bytes"));
    });
    var t = tip.querySelector("tr[data-total]");
    if (t) out.hover.total = Number(t.getAttribute("data-total"));
  } catch (e) {
    out.checker_error = String(e && e.stack || e);
  }
  var pre = document.createElement("pre");
  pre.id = "memfit-test-result";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def render(page, tmp_path):
    """Loads the page from a file in headless chromium; what CHECKER saw."""
    text = page.read_text(encoding="utf-8")
    assert text.count("<head>") == 1 and text.count("</body>") == 1
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("<head>", "<head>" + COLLECTOR).replace("</body>", CHECKER + "</body>"),
                     encoding="utf-8")
    done = subprocess.run(
        [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
         f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1280,2000",
         "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, timeout=180,
    )
    found = re.search(r'<pre id="memfit-test-result">(.*?)</pre>', done.stdout, re.S)
    assert found, f"chromium printed no result (exit {done.returncode}): {done.stderr[-3000:]}"
    result = json.loads(html.unescape(found.group(1)))
    assert "checker_error" not in result, result["checker_error"]
    return result


def embedded(page):
    """The JSON the page embeds: report, peak, plot, prediction, advice."""
    text = page.read_text(encoding="utf-8") if hasattr(page, "read_text") else page
    found = re.search(r'<script type="application/json" id="memfit-data">(.*?)</script>', text, re.S)
    return json.loads(found.group(1).replace("<\\/", "</"))


def at(doc, path):
    for part in path.split("."):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def expect_figures_equal_json(fields, data):
    """Every number the page shows is its JSON value, formatted."""
    assert fields
    for f in fields:
        value = at(data, f["field"])
        if f["bytes"] is None:  # a count (the largest batch)
            assert f["text"] == str(value), f
        else:
            assert int(f["bytes"]) == value, f
            assert f["text"] in (memfit.format_bytes(value), "+" + memfit.format_bytes(value)), f


def expect_every_report_number_shown(fields, report_json):
    shown = {f["field"] for f in fields}
    expected = {"report.peak_bytes"}
    for i, _ in enumerate(report_json["phases"]):
        expected |= {f"report.phases.{i}.{k}" for k in ("live_bytes_after", "delta_bytes",
                                                          "peak_bytes")}
    expected |= {f"report.categories_at_peak.{k}"
                 for k, v in report_json["categories_at_peak"].items() if v}
    expected |= {f"report.modules.{i}.activation_bytes" for i, _ in enumerate(report_json["modules"])}
    assert expected <= shown, sorted(expected - shown)


def expect_rendered_well(result, data, svgs):
    assert result["errors"] == []
    assert result["svgs"] == svgs
    assert result["overlaps"] == [], "labels drawn over each other"
    assert result["outside"] == [], "labels drawn outside their picture"
    expect_figures_equal_json(result["fields"], data)
    expect_every_report_number_shown(result["fields"], data["report"])
    # Hovering the peak shows its exact bytes, category by category.
    hover = result["hover"]
    assert hover["visible"]
    assert hover["total"] == data["report"]["peak_bytes"]
    assert hover["categories"] == {k: v for k, v in data["report"]["categories_at_peak"].items() if v}


@pytest.fixture(scope="module")
def cli_page(tmp_path_factory):
    """The demo's page: gpt at batch 16 with Adam, a budget, per-rank peaks;
    the JSON printed by the same run."""
    page = tmp_path_factory.mktemp("cli") / "gpt.html"
    out = subprocess.run(
        [sys.executable, "-m", "memfit", "profile", *GPT, "--batch", "16", "--target", "cuda",
         "--world-size", "8", "--budget", "256MiB", "--html", str(page), "--json"],
        capture_output=True, text=True, env=ENV, check=True,
    ).stdout
    return page, json.loads(out)


def test_cli_page_embeds_the_json_it_printed(cli_page):
    page, printed = cli_page
    data = embedded(page)
    assert data["report"] == printed
    assert data["prediction"]["budget_bytes"] == 256 * 2**20
    assert data["prediction"]["max_batch"] > 16
    # The peak's annotation: its top two categories and modules, in bytes.
    peak = data["peak"]
    assert peak["bytes"] == printed["peak_bytes"]
    top = sorted(((v, k) for k, v in printed["categories_at_peak"].items() if v), reverse=True)
    assert [c["bytes"] for c in peak["categories"][:2]] == [v for v, _ in top[:2]]
    text = page.read_text(encoding="utf-8")
    for line in (
        f"{peak['categories'][0]['name']} {memfit.format_bytes(peak['categories'][0]['bytes'])}, "
        f"{peak['categories'][1]['name']} {memfit.format_bytes(peak['categories'][1]['bytes'])}",
        f"modules: {peak['modules'][0]['name']} {memfit.format_bytes(peak['modules'][0]['bytes'])}, "
        f"{peak['modules'][1]['name']} {memfit.format_bytes(peak['modules'][1]['bytes'])}",
    ):
        assert f">{html.escape(line, quote=False)}</text>" in text, line


@needs_chromium
def test_cli_page_renders_in_chromium_and_shows_the_jsons_numbers(cli_page, tmp_path):
    page, printed = cli_page
    data = embedded(page)
    result = render(page, tmp_path)
    expect_rendered_well(result, data, svgs=3)  # timeline, modules, prediction
    shown = {f["field"] for f in result["fields"]}
    assert {"report.cuda.peak_reserved_bytes", "report.data_parallel.per_rank.3.peak_bytes",
            "prediction.max_batch", "prediction.predicted_peak_bytes"} <= shown


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )


def test_python_page_embeds_the_reports_json():
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    report = memfit.profile(small_model(), x, y, optimizer="adam")
    page = report_page.html_page(report, predict=False)
    data = embedded(page)
    assert data["report"] == json.loads(report.to_json())
    assert data["prediction"] is None and data["advice"] is None
    assert page.count("<svg") == 2
    with pytest.raises(ValueError, match="'time' or 'events'"):
        report_page.html_page(report, predict=False, x_axis="wall")


@needs_chromium
def test_save_html_with_prediction_and_advice_renders_in_chromium(tmp_path):
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    model = small_model()
    report = memfit.profile(model, x, y, optimizer="adam")
    budget = 2 * report.peak_bytes
    advice = memfit.advise(model, x, y, optimizer="adam", budget=budget, repeats=1)
    path = report_page.save_html(report, str(tmp_path / "step.html"), budget=budget,
                                 advice=advice, x_axis="events")
    page = tmp_path / "step.html"
    assert path == str(page)
    data = embedded(page)
    assert data["report"] == json.loads(report.to_json())
    assert data["plot"]["x_axis"] == "events"
    assert [r["peak_bytes"] for r in data["advice"]["rows"]] == [r.peak_bytes for r in advice.rows]
    result = render(page, tmp_path)
    expect_rendered_well(result, data, svgs=3)
    shown = {f["field"] for f in result["fields"]}
    assert {f"advice.rows.{i}.peak_bytes" for i in range(len(advice.rows))} <= shown
