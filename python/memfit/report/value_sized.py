"""What a step whose memory depends on its batch's values says, and what a
fit's answer above the example batch is worth then: See Note [Memory that
depends on the batch's values] (include/memfit/torch/op_frames.h)."""

from __future__ import annotations

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


def _named(ops) -> str:
    names = list(dict.fromkeys(_WHAT.get(op, op) for op in ops))
    if "nonzero" in names:  # boolean indexing calls it
        names[names.index("nonzero")] = "nonzero or boolean indexing"
    return ", ".join(names)


def profile_note(ops, batch: int) -> str:
    """The profile's note for a step that ran `ops` at `batch` samples."""
    return (f"unsure beyond this batch: the step ran {_named(ops)}, whose memory depends on the "
            f"values it runs on (the batch's, or the weights'); other batch sizes are measured "
            f"on these {batch} samples cut or repeated, which hold no new values (predictions "
            f"and fits above {batch} may fall short of your data's)")


def settle_fit(fit, ops, example: int) -> None:
    """A fit whose step ran `ops` on an example of `example` samples: above
    it the verification repeated the example's samples, so the answer is not
    verified for the user's data, and the notes say why and what to do."""
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
