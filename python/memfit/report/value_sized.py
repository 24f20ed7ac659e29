"""What a step whose memory depends on its batch's values says, and what a
fit's answer above the example batch is worth then: See Note [Memory that
depends on the batch's values] (include/memfit/torch/op_frames.h), and
Note [A step that reads its batch's values] (_step/host_reads.py)."""

from __future__ import annotations

from .._step.host_reads import READ_PREFIX

__all__: list = []

# What the user wrote, for each op the recorder names.
_WHAT = {
    "aten::_unique": "torch.unique", "aten::_unique2": "torch.unique",
    "aten::unique_dim": "torch.unique", "aten::unique_consecutive": "unique_consecutive",
    "aten::unique_dim_consecutive": "unique_consecutive", "aten::nonzero": "nonzero",
    "aten::argwhere": "argwhere", "aten::masked_select": "masked_select",
    "aten::bincount": "bincount", "aten::repeat_interleave": "repeat_interleave",
    "aten::embedding_sparse_backward": "sparse gradients",
    "aten::_embedding_bag_sparse_backward": "sparse gradients",
    "aten::_coalesce": "sparse gradients",
}


def _split(ops):
    """(the value-sized ops, the sites of reads into Python) among `ops`."""
    sized = [op for op in ops if not op.startswith(READ_PREFIX)]
    return sized, [op[len(READ_PREFIX):] for op in ops if op.startswith(READ_PREFIX)]


def _named(ops) -> str:
    names = list(dict.fromkeys(_WHAT.get(op, op) for op in ops))
    if "nonzero" in names:  # boolean indexing calls it
        names[names.index("nonzero")] = "nonzero or boolean indexing"
    return ", ".join(names)


def _reads_line(sites, example: int, above: bool) -> str:
    """The line on reads of tensor values into Python: See Note [A step
    that reads its batch's values] (_step/host_reads.py)."""
    shown = ", ".join(sites[:3]) + (" ..." if len(sites) > 3 else "")
    where = (f"every batch above {example} was measured on your {example} samples repeated, "
             f"which take their path" if above else f"the batches measured were cut from your "
             f"{example} samples and took their path")
    return (f"unsure: the step reads tensor values into Python at {shown} (if t:, .item(), "
            f"int(t)), and a branch or a size taken from them follows the values: {where}; "
            f"batches whose values take a heavier path may need more memory")


def profile_note(ops, batch: int) -> str:
    """The profile's note for a step that ran `ops` at `batch` samples."""
    sized, sites = _split(ops)
    if not sized:
        return _reads_line(sites, batch, True)
    return (f"unsure beyond this batch: the step ran {_named(sized)}, whose memory depends on "
            f"the values it runs on (the batch's, or the weights'); other batch sizes are "
            f"measured on these {batch} samples cut or repeated, which hold no new values "
            f"(predictions and fits above {batch} may fall short of your data's)"
            + (f"; it also reads tensor values into Python at {', '.join(sites[:3])}"
               if sites else ""))


def settle_fit(fit, ops, example: int) -> None:
    """A fit whose step ran `ops` on an example of `example` samples: above
    it the verification repeated the example's samples, so the answer is not
    verified for the user's data, and the notes say why and what to do. A
    step that only reads values into Python is said unsure, its answer left
    verified: See Note [A step that reads its batch's values]."""
    ops, sites = _split(ops)
    if sites:
        fit.notes = list(fit.notes) + [_reads_line(sites, example, fit.max_batch > example)]
    if not ops:
        return
    if fit.max_batch > example:
        fit.verified = False
        line = (f"unverified: the step ran {_named(ops)}, whose memory depends on the values "
                f"it runs on (the batch's, or the weights'), and batch {fit.max_batch} was "
                f"measured on your {example} samples repeated (no new values): real batches "
                f"that large may need more memory; pass an example of at least "
                f"{fit.max_batch} real samples to verify it")
    else:
        line = (f"the step ran {_named(ops)}, whose memory depends on the values it runs on "
                f"(the batch's, or the weights'): batch {fit.max_batch} was verified on the "
                f"first {fit.max_batch} of your samples; batches whose values differ may need "
                f"more memory")
    fit.notes = list(fit.notes) + [line]
