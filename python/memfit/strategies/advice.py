"""What memfit.advise returns: the measured rows, the plan, and the Advice
that prints them and applies the plan to a model."""

import dataclasses
import json

from .. import _memfit
from . import Strategy, applied


@dataclasses.dataclass
class Row:
    """One strategy measured at the user's whole batch."""

    name: str
    # baseline | memory | checkpointing | precision | optimizer | eval | combination
    kind: str
    strategy: Strategy
    peak_bytes: int  # memfit.profile of the transformed step
    saving_bytes: int  # plain peak - peak (negative: costs memory)
    time_ratio: float  # median step time / the plain step's, same process
    fits: bool  # peak <= budget; None without a budget
    exact: bool  # same result as the plain step
    recompute_ns: float = None  # checkpointing: forward time recomputed
    predicted_peak_bytes: int = None  # checkpointing: the planner's prediction

    def to_dict(self):
        d = dataclasses.asdict(self)
        d["strategy"] = dataclasses.asdict(self.strategy)
        d["strategy"]["checkpoint"] = list(self.strategy.checkpoint)
        return d


@dataclasses.dataclass
class Plan:
    """What to run: found=False when there is no budget to plan for."""

    found: bool
    strategy: Strategy
    summary: str
    peak_bytes: int
    time_ratio: float
    exact: bool
    # the optimizer to train with (adam, momentum, sgd, ...); "-offload" after
    # it: that optimizer wrapped in memfit.offload
    optimizer: str


class _Applied:
    """A strategy's model-side parts, on the model until restore() (or the
    end of a `with` block)."""

    def __init__(self, model, strategy, block_paths):
        self._cm = applied(model, strategy, block_paths)
        self._cm.__enter__()
        self.model = model

    def restore(self):
        if self._cm is not None:
            cm, self._cm = self._cm, None
            cm.__exit__(None, None, None)

    def __enter__(self):
        return self.model

    def __exit__(self, *exc):
        self.restore()


class Advice:
    """Every strategy measured on the model, and the plan for the budget.

    model (class name), batch, budget_bytes (None: no budget), optimizer
    (the user's: adam, momentum, sgd, none or a class name),
    parameter_bytes, plain_peak_bytes, plain_step_ms; chain (a Chain:
    path, block_paths, found; None without one); rows (Row: name, kind,
    strategy, peak_bytes, saving_bytes, time_ratio, fits, exact,
    recompute_ns, predicted_peak_bytes); segments and chain_memory (what
    the core planner was given); chain_plans (its rules compared:
    rule, checkpointed, predicted_peak, recompute_ns, fits); plan (Plan:
    found, strategy, summary, peak_bytes, time_ratio, exact, optimizer);
    notes.
    """

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def apply(self, model, what=None):
        """Put the plan's (or a Row's / Strategy's) model-side parts on
        `model` (this model or a copy of it): checkpointed blocks, bf16
        autocast. Returns a handle: use it in a `with` block, or call
        restore(). The optimizer is the training loop's (optimizer_for()
        gives the one the plan trains with); memfit.Trainer frees gradients
        itself."""
        s = what.strategy if isinstance(what, Row) else what or self.plan.strategy
        paths = self.chain.block_paths if self.chain else []
        for i in s.checkpoint:
            try:
                model.get_submodule(paths[i])
            except (AttributeError, IndexError):
                raise ValueError(
                    f"[Advice.apply] the model has no block {paths[i] if i < len(paths) else i!r}"
                    f" to checkpoint: apply the advice to the model it was made for"
                ) from None
        return _Applied(model, s, paths)

    def optimizer_for(self, optimizer, what=None):
        """The optimizer to train with under the plan (or a Row's / Strategy's
        strategy): `optimizer` itself, or wrapped in memfit.offload where the
        plan keeps its state on the host. A plan that changes the optimizer
        (a lighter one, allow_approximate) names it instead: build that one
        with your hyperparameters."""
        s = what.strategy if isinstance(what, Row) else what or self.plan.strategy
        if s.optimizer is not None:
            raise ValueError(
                f"[Advice.optimizer_for] the plan trains with {s.optimizer} instead of "
                f"{self.optimizer}: build that optimizer with your hyperparameters")
        if not s.host_state:
            return optimizer
        from ..host_offload import OffloadedOptimizer, offload
        return optimizer if isinstance(optimizer, OffloadedOptimizer) else offload(optimizer)

    def table(self):
        fb = _memfit.format_bytes
        budget = "none" if self.budget_bytes is None else fb(self.budget_bytes)
        out = [
            f"memfit advise: {self.model}, batch {self.batch}, optimizer {self.optimizer}, "
            f"budget {budget}",
            f"plain step: peak {fb(self.plain_peak_bytes)}, {self.plain_step_ms:.1f} ms per "
            f"step; parameters and buffers {fb(self.parameter_bytes)}",
            f"chain: {self.chain.describe() if self.chain else 'none'}",
            "",
        ]
        yn = {True: "yes", False: "no", None: "-"}
        rows = [
            [r.name, fb(r.peak_bytes), fb(r.saving_bytes), f"{r.time_ratio:.2f}x", yn[r.fits],
             "no training" if r.kind == "eval" else "same" if r.exact else "changes"]
            for r in self.rows
        ]
        out += _text_table(["strategy", "peak", "saving", "time", "fits", "result"], rows, "lrrrll")
        if self.chain_plans:
            every = next((p for p in self.chain_plans if p.rule == "every layer"), None)
            base = every.recompute_ns if every and every.recompute_ns > 0 else 0
            out += ["", "checkpointing rules on the chain (predicted; recompute as a share of "
                    "checkpointing every block's)"]
            rules = [
                [p.rule, p.indices(), fb(p.predicted_peak),
                 f"{p.recompute_ns / base if base else 0:.2f}x", yn[p.fits if self.budget_bytes
                                                                   is not None else None]]
                for p in self.chain_plans
            ]
            out += _text_table(["rule", "blocks", "predicted peak", "recompute", "fits"], rules,
                               "llrrl")
        p = self.plan
        line = f"plan: {p.summary}"
        if p.found:
            line += (f": peak {fb(p.peak_bytes)} (measured), time {p.time_ratio:.2f}x of the "
                     f"plain step, {'same result' if p.exact else 'changes the numbers'}")
        elif self.budget_bytes is not None:
            line += f": does not fit (the lowest measured peak, {fb(p.peak_bytes)})"
        else:
            line += " (no budget to plan for)"
        out += ["", line]
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out) + "\n"

    def to_json(self, pretty=True):
        """Keys: model, batch, budget_bytes, optimizer, parameter_bytes,
        plain_peak_bytes, plain_step_ms, chain, strategies, checkpoint_rules,
        plan, notes."""
        plan = dataclasses.asdict(self.plan)
        plan["strategy"]["checkpoint"] = list(self.plan.strategy.checkpoint)
        doc = dict(
            model=self.model,
            batch=self.batch,
            budget_bytes=self.budget_bytes,
            optimizer=self.optimizer,
            parameter_bytes=self.parameter_bytes,
            plain_peak_bytes=self.plain_peak_bytes,
            plain_step_ms=self.plain_step_ms,
            chain=None if self.chain is None else dataclasses.asdict(self.chain),
            strategies=[r.to_dict() for r in self.rows],
            checkpoint_rules=[
                dict(rule=c.rule, blocks=c.indices(), predicted_peak_bytes=c.predicted_peak,
                     recompute_ns=c.recompute_ns, fits=c.fits)
                for c in self.chain_plans
            ],
            plan=plan,
            notes=self.notes,
        )
        return json.dumps(doc, indent=2 if pretty else None)

    def __repr__(self):
        return self.table()


def _text_table(header, rows, align):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]

    def line(cells):
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align)]
        return "  ".join(parts).rstrip()

    return [line(header)] + [line(r) for r in rows]
