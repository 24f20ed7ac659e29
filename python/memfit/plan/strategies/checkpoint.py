"""Activation checkpointing over a chain of blocks: finding the chain and
running chosen blocks under torch.utils.checkpoint. What each block saves
and costs is read from the recorded steps by the core's planner
(core/plan/chain_calibration.h)."""

import contextlib
import dataclasses

import torch
import torch.utils.checkpoint

__all__ = ["find_chain", "resolve_chain", "checkpointed"]


@dataclasses.dataclass
class Chain:
    """The blocks advise may checkpoint, in the order forward runs them."""

    path: str  # the container's path in the model ("" the model itself); None for a list
    block_paths: list  # each block's path in the model, for get_submodule
    found: bool  # True when advise chose it (chain= not given)

    def __len__(self):
        return len(self.block_paths)

    def describe(self):
        if self.path is None:
            return f"the {len(self)} modules given as chain="
        where = self.path or "the model itself"
        how = "found" if self.found else "given"
        return f"{where} ({len(self)} blocks, {how})"


def _paths(model):
    return {id(m): path for path, m in model.named_modules(remove_duplicate=False)}


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


def _has_parameters(module):
    return any(True for _ in module.parameters())


def find_chain(model):
    """The longest nn.Sequential / nn.ModuleList anywhere in `model` with at
    least two blocks holding parameters (ties: the shallowest, then the
    first); None when there is none."""
    best, best_key = None, None
    for path, m in model.named_modules():
        if not isinstance(m, (torch.nn.Sequential, torch.nn.ModuleList)):
            continue
        children = list(m.named_children())
        weighted = sum(1 for _, c in children if _has_parameters(c))
        if weighted < 2:
            continue
        key = (weighted, len(children), -path.count(".") - bool(path))
        if best_key is None or key > best_key:
            best_key = key
            best = Chain(path, [_join(path, name) for name, _ in children], True)
    return best


def resolve_chain(model, chain):
    """The Chain for advise's chain= argument: None (find one), an
    nn.Sequential / nn.ModuleList inside the model (or its path, a str), or
    a list of its modules.
    Raises ValueError for modules that are not the model's."""
    if chain is None:
        return find_chain(model)
    if isinstance(chain, str):  # a path, as model.named_modules() names it
        try:
            chain = model.get_submodule(chain)
        except AttributeError:
            raise ValueError(
                f"[advise] chain={chain!r} is not a submodule of the model: give its path as "
                f"model.named_modules() names it (e.g. 'transformer.h'), or the module itself"
            ) from None
    paths = _paths(model)
    if isinstance(chain, (torch.nn.Sequential, torch.nn.ModuleList)):
        if id(chain) not in paths:
            raise ValueError(
                f"[advise] chain= is a {type(chain).__name__} that is not inside the "
                f"model: pass one of the model's own submodules (e.g. model.layers)"
            )
        path = paths[id(chain)]
        blocks = [_join(path, name) for name, _ in chain.named_children()]
        result = Chain(path, blocks, False)
    elif isinstance(chain, (list, tuple)):
        blocks = []
        for i, m in enumerate(chain):
            if not isinstance(m, torch.nn.Module):
                raise ValueError(
                    f"[advise] chain= item {i} is a {type(m).__name__}, not an nn.Module"
                )
            if id(m) not in paths:
                raise ValueError(
                    f"[advise] chain= block {i} ({type(m).__name__}) is not a module "
                    f"of the model: pass the model's own blocks"
                )
            blocks.append(paths[id(m)])
        result = Chain(None, blocks, False)
    else:
        raise ValueError(
            f"[advise] chain= must be an nn.Sequential, an nn.ModuleList or a list "
            f"of the model's modules, got {type(chain).__name__}"
        )
    if not result.block_paths:
        raise ValueError("[advise] chain= holds no blocks")
    return result


# Note [A checkpointed block beside a KV cache]
# An HF decoder layer given the model's KV cache (use_cache=True, the
# default of Llama's config) appends its keys and values to it at every
# call: the recompute in backward appended them a second time, so every
# layer's cache doubled (a 2-layer Llama's 9 cached tokens became 18).
# Where the layer's cache was empty when the block first ran (a
# training forward from no cache), the recompute runs without it: the
# attention then sees the same keys and values, and the cache is not grown.
_CACHE_KWARGS = ("past_key_values", "past_key_value")


def _layer_cache_empty(forward, cache):
    """Whether `cache` holds nothing yet for the layer whose forward this
    is (its self_attn.layer_idx); False when that cannot be told."""
    layer = getattr(getattr(getattr(forward, "__self__", None), "self_attn", None),
                    "layer_idx", None)
    length = getattr(cache, "get_seq_length", None)
    if layer is None or not callable(length):
        return False
    try:
        return length(layer) == 0
    except Exception:  # noqa: BLE001 - a cache of another kind: leave it as it is
        return False


def _checkpointed_forward(forward):
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        # See Note [A checkpointed block beside a KV cache].
        key = next((k for k in _CACHE_KWARGS if kwargs.get(k) is not None), None)
        if key is not None and _layer_cache_empty(forward, kwargs[key]):
            calls = []

            def fn(*a):
                calls.append(None)
                again = dict(kwargs, **{key: None}) if len(calls) > 1 else kwargs
                return forward(*a, **again)
        else:
            fn = (lambda *a: forward(*a, **kwargs)) if kwargs else forward
        # Non-reentrant: gradients reach every tensor the block uses (kwargs,
        # closures), and dropout replays from the saved RNG state.
        return torch.utils.checkpoint.checkpoint(
            fn, *args, use_reentrant=False, preserve_rng_state=True
        )

    return run


@contextlib.contextmanager
def override_forward(module, wrap):
    """module.forward replaced by wrap(module.forward) inside the block."""
    had = "forward" in module.__dict__
    before = module.__dict__.get("forward")
    module.forward = wrap(module.forward)
    try:
        yield module
    finally:
        if had:
            module.forward = before
        else:
            del module.forward


@contextlib.contextmanager
def checkpointed(blocks):
    """Each of `blocks` runs its forward under torch.utils.checkpoint inside
    the block: its activations are dropped after forward and recomputed in
    backward. Gradients equal the plain step's."""
    with contextlib.ExitStack() as stack:
        for b in blocks:
            stack.enter_context(override_forward(b, _checkpointed_forward))
        yield blocks
