"""Printers the benchmarks share: bytes, percentages and Markdown tables.
Plain Python, no torch or memfit, so that bench/gpu/compare_cuda.py can use
it where memfit's extension does not import (the leading underscore keeps
bench/run_all.py from running it)."""

__all__ = ["fmt_bytes", "pct", "err_cell", "md_table"]


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def pct(x):
    return "-" if x is None else f"{x * 100:+.2f}%"


def err_cell(pred, measured):
    """'+1.23%', with the bytes when the percentage rounds to zero."""
    if pred is None or not measured:
        return "-"
    d = pred - measured
    text = pct(d / measured)
    if d and abs(d / measured) < 5e-5:
        text += f", {'+' if d > 0 else '-'}{fmt_bytes(abs(d))}"
    return text


def md_table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "/") for c in r) + " |")
    return "\n".join(out)
