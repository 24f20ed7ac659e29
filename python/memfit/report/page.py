"""One self-contained HTML page of a profiled step: memory by category over
time and activations by module (hover for exact bytes), the tables, the
notes, the peak over batch sizes with the budget line, and the advise
table. No network, no external scripts: one file that opens anywhere.

    report = memfit.profile(model, x, y, optimizer=opt)
    report.save_html("step.html", budget="8GiB")

The page is drawn by the C++ core (render/html_report.h), the same page
`memfit profile --html FILE` writes."""

from .._native import native as _memfit
from .._step.device import to_bytes

__all__: list = []


def advice_table(advice):
    """What the page shows of a memfit.advise() result: each strategy's
    peak, saving, time, whether it fits and whether the result changes, and
    the plan in one line (core's advice_table, the mapping `memfit profile
    --html --advise` uses)."""
    return _memfit.advice_table(advice.native)


def html_page(report, title=None, budget=None, advice=None, x_axis="time", predict=True):
    """The page of `report` (what memfit.profile returns) as a string.

    - title: the page's heading; None: "memfit profile: <model>, batch ..."
    - budget: bytes or a string like "8GiB"; draws the budget line on the
      prediction and names the largest batch under it.
    - advice: a memfit.advise() result, shown as the advise table.
    - x_axis: "time" (wall time of each allocation) or "events" (event
      order, each allocation one step).
    - predict: draw the peak over batch sizes, from the model of the
      probes report.prediction() grows (report.peak_model(): run on first
      use, kept by the report; the one probing path). Reports that cannot
      probe are drawn without it.
    """
    native, timeline = _native_of(report)
    budget_bytes = 0 if budget is None else to_bytes(budget, "save_html")
    prediction = None
    if predict:
        try:
            prediction = report.peak_model()
        except ValueError:  # this report cannot probe other batches
            prediction = None
    return _memfit.html_report(
        native, timeline, title=title or "", x_axis=x_axis, budget=budget_bytes,
        prediction=prediction, advice=None if advice is None else advice_table(advice),
    )


def save_html(report, path, title=None, budget=None, advice=None, x_axis="time", predict=True):
    """Write the page of `report` to `path` (see html_page() for the
    arguments) and return `path`."""
    page = html_page(report, title=title, budget=budget, advice=advice, x_axis=x_axis,
                     predict=predict)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


def _native_of(report):
    """The native report and its timeline. memfit.Report keeps the native
    one private; Report.save_html passes itself here."""
    if isinstance(report, _memfit.Report):
        raise TypeError(
            "[save_html] pass the memfit.Report that memfit.profile returns: the page "
            "needs its timeline too")
    return report.native, report.timeline
