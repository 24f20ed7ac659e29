"""Loss analysis: the roots (reductions over the batch) and the tail of a lazy
loss, whether the loss is linear in its roots, and evaluating the tail.
"""

import torch

from ..graph.errors import LazyError
from ..graph.node import Node
from ..graph.template import ChunkCtx, pluck, subst
from .execute import collect_nodes, is_source

__all__: list = []


_LINEAR_ONE = {
    "neg", "positive", "sum", "mean", "view", "reshape", "squeeze", "unsqueeze",
    "flatten", "clone", "contiguous", "getitem", "select", "T", "t", "transpose",
    "permute", "to", "float", "double", "half", "bfloat16", "expand", "expand_as",
    "view_as", "reshape_as", "detach", "item", "type", "type_as", "squeeze_",
    "broadcast_to", "narrow",
}
_LINEAR_MANY = {"add", "sub", "subtract", "rsub", "stack", "cat", "concat", "concatenate",
                "hstack", "vstack"}
_SCALE = {"mul", "multiply"}
_DIVIDE = {"div", "true_divide", "divide"}


def _is_root(n):
    if n.state != "reduced":
        return False
    parents = n.parent.parents if n.kind == "item" else n.parents
    return any(p.state == "batched" for p in parents)


class _Plan:
    def __init__(self, target):
        self.target = target
        self.B = target.B
        self.roots = []  # reduction roots, recording order
        self.tail = []  # nodes between the roots and the target
        self.problem = None  # why chunks cannot be combined (None: they can)
        self.mixes = None
        self.grad_roots = []
        self.const_roots = []


def analyze_loss(T, train, overrides=None):
    """Roots and tail of a reduced target (see the lazy_mode.run package docstring)."""
    plan = _Plan(T)
    order, sources, _ = collect_nodes([T], train, overrides)
    plan.mixes = next((n.mixes for n in order if n.mixes and n not in sources), None)
    if T.state != "reduced":
        return plan
    roots, tail, seen = [], [], set()
    stack = [T]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n is not T and is_source(n, train, overrides):
            continue
        if n.state == "eager":
            continue
        if _is_root(n):
            roots.append(n)
            continue
        tail.append(n)
        stack.extend(p for p in n.parents if p.state in ("reduced", "struct"))
    roots.sort(key=lambda n: n.id)
    tail.sort(key=lambda n: n.id)
    plan.roots, plan.tail = roots, tail
    for r in roots:
        if r.rkind is None:
            plan.problem = (
                f"{r.name} at {r.where} reduces over the batch, but memfit knows how to add "
                f"up chunks only for sums, means and torch's loss functions (reduction "
                f"'mean', 'sum' or 'batchmean')"
            )
            break
    if train:
        plan.grad_roots = [r for r in roots if r.requires_grad]
        plan.const_roots = [r for r in roots if not r.requires_grad]
        if plan.problem is None:
            plan.problem = _check_linear(plan)
    return plan


def _depends(obj, dep):
    t = type(obj)
    if t is Node:
        return dep.get(obj, False)
    if t is tuple or t is list:
        return any(_depends(o, dep) for o in obj)
    if t is dict:
        return any(_depends(o, dep) for o in obj.values())
    return False


def _needs_grad(obj, dep):
    """A non-root operand that requires grad (makes a product bilinear)."""
    t = type(obj)
    if t is Node:
        return obj.requires_grad and not dep.get(obj, False)
    if t is tuple or t is list:
        return any(_needs_grad(o, dep) for o in obj)
    if isinstance(obj, torch.Tensor):
        return obj.requires_grad
    return False


def _check_linear(plan):
    """None if the loss is linear in the roots that need gradients;
    otherwise why not."""
    dep = {r: True for r in plan.grad_roots}
    for n in plan.tail:
        if n.kind == "item":
            dep[n] = dep.get(n.parent, False)
            continue
        operands = list(n.args) + list(n.kwargs.values())
        d = _depends(operands, dep)
        dep[n] = d
        if not d:
            continue
        op = n.op
        bad = None
        if op in _LINEAR_ONE:
            if _depends(operands[1:], dep):
                bad = "it combines two values computed from the batch"
        elif op in _LINEAR_MANY:
            pass
        elif op in _SCALE:
            deps = [o for o in operands if _depends(o, dep)]
            if len(deps) > 1:
                bad = "it multiplies two values computed from the batch"
            elif any(_needs_grad(o, dep) for o in operands if not _depends(o, dep)):
                bad = "the factor itself needs gradients"
        elif op in _DIVIDE:
            if _depends(operands[1:], dep):
                bad = "it divides by a value computed from the batch that needs gradients"
            elif _needs_grad(operands[1:], dep):
                bad = "the divisor itself needs gradients"
        elif op == "rdiv":
            bad = "it divides by the loss"
        else:
            bad = "it is not a sum, difference, or product with a constant"
        if bad:
            return (
                f"{n.name} at {n.where} is applied to the batch's reduced loss, and {bad}; "
                f"the gradients of chunks add up only when the loss is a sum or mean "
                f"over samples combined linearly (+, -, and * or / by constants)"
            )
    return None


def unsupported(plan, what):
    return LazyError(
        f"memfit.lazy cannot split {what}: {plan.problem}. Pass allow_mixing=True to "
        f"memfit.lazy() to run it whole (one chunk, as eager PyTorch would), or "
        f"compute the loss as a sum/mean of per-sample terms."
    )


def eval_tail(plan, values, grad):
    """Evaluate tail nodes with root values given; returns the target's value."""
    env = dict(values)
    ctx = ChunkCtx(env, 0, plan.B)
    with torch.set_grad_enabled(grad):
        for n in plan.tail:
            if n in env:
                continue
            for p in n.parents:
                if p not in env and (p.state == "eager" or p.value is not None):
                    env[p] = p.value
            if n.kind == "item":
                env[n] = pluck(env[n.parent], n.path)
            else:
                env[n] = n.fn(*subst(n.args, ctx), **subst(n.kwargs, ctx))
    v = env[plan.target]
    return v.detach() if not grad else v
