"""Several optimizers over different parameters, stepped as one: a loop that
steps Muon over the matrices and AdamW over the rest, given to memfit as
optimizer=[muon, adamw]. See Note [Several optimizers in one step]."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, MutableMapping

import torch

__all__: list = []

# Note [Several optimizers in one step]
# memfit's step ends with one optimizer's step(). A loop that steps two
# optimizers over different parameters (Muon for the matrices and AdamW for
# the embeddings and norms; a backbone's and a head's) was refused, or
# measured with one of them: the other's state left out, or an AdamW over
# everything standing in, more state than Muon keeps. OptimizerChain is
# those optimizers as one torch.optim.Optimizer: param_groups are theirs
# (their hyperparameters, changed in place, are theirs), state is routed to
# the optimizer holding each parameter, and step() and zero_grad() call
# each in the order given, as the user's loop does. memfit's hooks on
# step() see the chain's step: the optimizer phase is all of them. The
# optimizers themselves are the user's: the rehearsal puts their state and
# hyperparameters back as for one optimizer.


def state_values(entry):
    """The values of one entry of an optimizer's state: a parameter's
    dict's values, or the entry itself where the optimizer keeps something
    else under a key of its own (state["global_step"] = 3, which torch's
    state_dict carries too)."""
    return entry.values() if isinstance(entry, Mapping) else (entry,)


class _RoutedState(MutableMapping):
    """The chain's state: each parameter's entry in the state of the
    optimizer that holds it (a missing one made there, as a defaultdict
    does)."""

    def __init__(self, chain):
        self._chain = chain
        self._by_id = {}  # id(parameter) -> (parameter, its optimizer), rebuilt on a miss

    def _owner(self, p):
        held = self._by_id.get(id(p))
        if held is None or held[0] is not p:  # a group added since, or a new tensor
            self._by_id = {id(q): (q, o) for o in self._chain.optimizers
                           for g in o.param_groups for q in g["params"]}
            held = self._by_id.get(id(p))
        if held is None or held[0] is not p:
            raise KeyError(p)
        return held[1]

    def __getitem__(self, p):
        return self._owner(p).state[p]

    def __setitem__(self, p, value):
        self._owner(p).state[p] = value

    def __delitem__(self, p):
        del self._owner(p).state[p]

    def __iter__(self):
        for o in self._chain.optimizers:
            yield from list(o.state)

    def __len__(self):
        return sum(len(o.state) for o in self._chain.optimizers)

    def clear(self):
        for o in self._chain.optimizers:
            o.state.clear()


class OptimizerChain(torch.optim.Optimizer):
    """The optimizers of `optimizers` as one: See Note [Several optimizers in
    one step]."""

    def __init__(self, optimizers):
        # Not Optimizer.__init__: it would make param groups of its own.
        self.optimizers = list(optimizers)
        self.defaults = {}
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()
        self._patch_step_function()  # so that step hooks run, as on any optimizer
        self.state = _RoutedState(self)

    @property
    def param_groups(self):
        return [g for o in self.optimizers for g in o.param_groups]

    @property
    def name(self):
        return "+".join(type(o).__name__ for o in self.optimizers)

    def step(self, closure=None):
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state_dict):
        for o, s in zip(self.optimizers, state_dict["optimizers"]):
            o.load_state_dict(s)

    def __repr__(self):
        return f"OptimizerChain({', '.join(repr(o) for o in self.optimizers)})"


def chained(optimizer):
    """A list or tuple of torch optimizers as one OptimizerChain (each
    parameter in one of them); anything else as it is. Raises a one-line
    ValueError for a parameter two of them hold."""
    if not (isinstance(optimizer, (list, tuple)) and optimizer
            and all(isinstance(o, torch.optim.Optimizer) for o in optimizer)):
        return optimizer
    seen = {}
    for k, o in enumerate(optimizer):
        for g in o.param_groups:
            for p in g["params"]:
                if id(p) in seen and seen[id(p)] != k:
                    raise ValueError(
                        f"optimizers {seen[id(p)]} and {k} of the list both hold a parameter "
                        f"of shape {tuple(p.shape)}: each would step it; give each parameter "
                        f"to one optimizer")
                seen[id(p)] = k
    return OptimizerChain(optimizer)
