"""The math, statistics, einsum and activation ops' names: jitgrad.<name> and Tensor.<name>."""
from jitgrad._core import dtype as _dt
from jitgrad.ops import activations, einsum, mathops
from jitgrad.ops.inplace import _apply

_BOTH = ("var", "std", "var_mean", "std_mean", "norm", "logsumexp", "cumsum", "cumprod", "diff", "square",
         "rsqrt", "log2", "log10", "exp2", "hypot", "addcmul", "addcdiv", "lerp", "nan_to_num", "isclose",
         "isinf", "isposinf", "isneginf", "logical_xor", "tril", "triu", "outer", "addmv", "baddbmm",
         "addbmm", "cross", "movedim", "roll", "floor", "ceil", "trunc", "round", "frac", "clamp_min", "clamp_max",
         "sinh", "cosh", "tan", "logaddexp", "deg2rad", "rad2deg", "flip", "count_nonzero")
FUNCTIONS = {name: getattr(mathops, name) for name in _BOTH}
FUNCTIONS.update({
    "ger": mathops.outer, "moveaxis": mathops.movedim, "meshgrid": mathops.meshgrid, "cdist": mathops.cdist,
    "einsum": einsum.einsum, "cosine_similarity": activations.cosine_similarity,
    "pairwise_distance": activations.pairwise_distance,
})
METHODS = {name: getattr(mathops, name) for name in _BOTH if name not in ("var_mean", "std_mean")}
METHODS.update({"ger": mathops.outer, "moveaxis": mathops.movedim, "isfinite": mathops.ew.isfinite,
                "sgn": mathops.ew.sign})
FUNCTIONS["sgn"] = mathops.ew.sign


def _inplace(fn):
    def method(self, *args, **kwargs):
        if fn.__name__ in ("cumsum", "cumprod") and self._data.dtype.kind == "b":  # the int64 sum can't go back
            raise _dt.not_implemented(fn.__name__ + "_out_cpu", self._data.dtype)
        return _apply(self, lambda old: fn(old, *args, **kwargs), *[a for a in args if hasattr(a, "_data")])
    method.__name__ = method.__qualname__ = fn.__name__ + "_"
    return method


for _name in ("addcmul", "addcdiv", "lerp", "tril", "triu", "square", "rsqrt", "log2", "log10", "exp2", "hypot",
              "nan_to_num", "baddbmm", "addmv", "addbmm", "cumsum", "cumprod", "floor", "ceil", "trunc", "round",
              "frac", "clamp_min", "clamp_max", "sinh", "cosh", "tan"):
    METHODS[_name + "_"] = _inplace(getattr(mathops, _name))
