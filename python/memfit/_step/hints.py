"""Type aliases the public API's hints share."""

from typing import Any, Callable, Sequence, Union

import torch

__all__ = ["Size"]

# A batch: a tensor, or tuples, lists and dicts of them (and of other values),
# split along its batch dimension.
Batch = Any
# A size in bytes: 1 << 30, 1.5e9, "16GiB", "800 MB".
Size = Union[int, float, str]
# loss_fn(output, target) -> a scalar tensor; None: the model's output is the loss.
LossFn = Callable[..., torch.Tensor]
# An optimizer instance, a list of them over different parameters, or a name
# memfit makes one of ("adam", "sgd", ...).
OptimizerArg = Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer], str, None]
# progress=True prints to stderr; a callable receives each line.
ProgressArg = Union[bool, Callable[[str], Any], None]
# step(model, batch) -> the loss (a scalar tensor): the user's own step; memfit
# runs backward and the optimizer (Note [The step function's contract]).
StepFn = Callable[[torch.nn.Module, Any], Any]
