"""What memfit knows of torch operations by name: elementwise ones, those that
mix or select along a dimension, need the batch first, depend on the data,
return values of the data or take inplace=; and binding a call's arguments.
"""

from ..._step.loss_rule import bind_arguments

__all__: list = []


POINTWISE = {
    "add", "sub", "rsub", "mul", "div", "true_divide", "rdiv", "floor_divide",
    "rfloordiv", "remainder", "rmod", "fmod", "pow", "rpow", "float_power", "eq",
    "ne", "lt", "le", "gt", "ge", "greater", "less", "greater_equal", "less_equal",
    "not_equal", "maximum", "minimum", "fmax", "fmin", "where", "masked_fill",
    "atan2", "arctan2", "hypot", "copysign", "logaddexp", "logaddexp2", "xlogy",
    "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
    "bitwise_xor", "and", "or", "xor", "lerp", "addcmul", "addcdiv", "clamp",
    "clip", "heaviside", "nextafter", "ldexp", "isclose", "lshift", "rshift",
    "subtract", "multiply", "divide",
}

# Operations that keep the shape but combine entries along `dim`.
DIM_MIXERS = {
    "softmax": ("dim", 1, "softmax"), "log_softmax": ("dim", 1, "softmax"),
    "softmin": ("dim", 1, "softmax"), "_softmax": ("dim", 1, None),
    "_log_softmax": ("dim", 1, None), "cumsum": ("dim", 1, None),
    "cumprod": ("dim", 1, None), "cummax": ("dim", 1, None),
    "cummin": ("dim", 1, None), "logcumsumexp": ("dim", 1, None),
    "sort": ("dim", 1, -1), "argsort": ("dim", 1, -1), "msort": (None, None, 0),
    "flip": ("dims", 1, None), "fliplr": (None, None, 1), "flipud": (None, None, 0),
    "roll": ("dims", 2, "all"), "normalize": ("dim", 2, 1),
}

# Operations that pick entries of `dim` by position or index.
SELECTORS = {
    "select": ("dim", 1), "narrow": ("dim", 1), "index_select": ("dim", 1),
    "gather": ("dim", 1), "scatter": ("dim", 1), "scatter_add": ("dim", 1),
    "scatter_reduce": ("dim", 1), "index_add": ("dim", 1), "index_copy": ("dim", 1),
    "index_fill": ("dim", 1), "take_along_dim": ("dim", 2), "split": ("dim", 2),
    "chunk": ("dim", 2), "tensor_split": ("dim", 2), "unbind": ("dim", 1),
    "split_with_sizes": ("dim", 2), "take": (None, None),
}

# Operations that need the batch at dimension 0 (N of NCHW).
BATCH_FIRST = {
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "max_pool1d", "max_pool2d", "max_pool3d",
    "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices",
    "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_max_pool1d",
    "adaptive_max_pool2d", "adaptive_max_pool3d", "adaptive_avg_pool1d",
    "adaptive_avg_pool2d", "adaptive_avg_pool3d", "lp_pool1d", "lp_pool2d",
    "interpolate", "upsample", "upsample_nearest", "upsample_bilinear",
    "pixel_shuffle", "pixel_unshuffle", "group_norm", "instance_norm",
    "local_response_norm", "dropout2d", "dropout3d", "feature_alpha_dropout",
    "grid_sample", "affine_grid", "fold", "channel_shuffle",
    "fractional_max_pool2d", "fractional_max_pool3d",
}

DATA_DEPENDENT = {
    "nonzero", "masked_select", "argwhere", "unique", "unique_consecutive",
    "repeat_interleave", "masked_scatter",
}


DATA_VALUED = {
    "equal", "allclose", "is_nonzero", "item", "tolist", "bool", "int", "float",
    "index", "complex", "contains", "numpy", "array", "format", "repr", "str",
    "any", "all",
}


# Operations returning a Python value of the data (not a tensor): computed on
# the full batch at once, never probed. A plain tensor beside the lazy one
# then holds the full batch too (torch.allclose(eager_out, lazy_out)).
PYTHON_VALUED = DATA_VALUED - {"any", "all"}


INPLACE_ARG = {
    "relu", "relu6", "elu", "selu", "celu", "leaky_relu", "rrelu", "hardtanh",
    "threshold", "dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d",
    "dropout2d", "dropout3d", "hardsigmoid", "hardswish", "silu", "mish",
}


# One signature binder for the package: see _step/loss_rule.py.
bind_args = bind_arguments


def inplace_positional(fn, args, kwargs):
    arguments = bind_args(fn, args, kwargs)
    return bool(arguments and arguments.get("inplace"))
