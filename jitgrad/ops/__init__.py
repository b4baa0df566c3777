"""The op table: the families of primitives and the one place that binds them as
`jitgrad.<name>` functions and Tensor methods.

Layout (each module imports only the ones above it; no import cycle):
  _common.py      grad-mode checks, operand handling, the registry `defop` publishes to
  elementwise.py  arithmetic, unary math, comparisons, where, to_dtype; `defop`
  device.py       to_device: .to(device), .cuda(), .cpu()
  shape.py        views, permute / transpose / t, expand, indexing (gather / scatter), cat / stack
  reduce.py       sum, mean, amax / amin, max / min, prod, sum_to
  linalg.py       matmul, mm, dot, mv, bmm, addmm, linear, trace
  nn.py           softmax, log_softmax, gelu, layer_norm, embedding, nll_loss, convolution, max_pool2d, pads
  functional.py   every op under one name space (what the engine calls as F.<name>)
  methods.py      Tensor operators (__add__...) and the methods that are not plain ops
  inplace.py      add_, mul_, fill_, copy_, setitem...
  gathers.py      gather / scatter / index_* / sort / topk / median / unique... (compositions)
Each primitive is one entry (graph/spec.py documents its keys) right beside its forward.
"""
from jitgrad.graph import tensor as _tensor
from jitgrad.graph.tensor import Tensor
from jitgrad.ops import _common, _forward, device, elementwise, gathers, linalg, nn, out, reduce, shape  # noqa: F401
from jitgrad.ops import mathops_table as mathops
from jitgrad.ops.elementwise import defop  # noqa: F401  (the public declarator: jitgrad.ops.defop)

# jitgrad.<name>: every public op; elementwise ones declared with defop come from _common.PUBLIC
FUNCTIONS = dict(_common.PUBLIC)
FUNCTIONS.update({
    "as_strided": shape.as_strided,
    # elementwise
    "add": elementwise.add, "sub": elementwise.sub, "mul": elementwise.mul, "div": elementwise.div,
    "pow": elementwise.pow, "reciprocal": elementwise.reciprocal, "sign": elementwise.sign,
    "clamp": elementwise.clamp, "clip": elementwise.clamp, "where": elementwise.where,
    "eq": elementwise.eq, "ne": elementwise.ne, "lt": elementwise.lt, "le": elementwise.le, "gt": elementwise.gt,
    "ge": elementwise.ge, "logical_and": elementwise.logical_and, "logical_or": elementwise.logical_or,
    "logical_not": elementwise.logical_not, "isnan": elementwise.isnan, "isfinite": elementwise.isfinite,
    "allclose": elementwise.allclose, "equal": elementwise.equal, "masked_fill": elementwise.masked_fill,
    # shape
    "reshape": shape.reshape, "flatten": shape.flatten, "squeeze": shape.squeeze, "unsqueeze": shape.unsqueeze,
    "expand": shape.expand, "permute": shape.permute, "transpose": shape.transpose, "t": shape.t,
    "swapdims": shape.transpose, "swapaxes": shape.transpose,
    "cat": shape.cat, "stack": shape.stack, "narrow": shape.narrow, "select": shape.select, "unbind": shape.unbind,
    "chunk": shape.chunk, "split": shape.split, "split_with_sizes": shape.split_with_sizes,
    "diagonal": shape.diagonal, "diag": shape.diag, "diag_embed": shape.diag_embed, "tile": shape.tile,
    "broadcast_to": shape.broadcast_to, "broadcast_tensors": shape.broadcast_tensors, "unflatten": shape.unflatten,
    "ravel": lambda input: shape.reshape(input, (-1,)),
    # reductions
    "sum": reduce.sum, "mean": reduce.mean, "amax": reduce.amax, "amin": reduce.amin, "max": reduce.max,
    "min": reduce.min, "argmax": reduce.argmax, "argmin": reduce.argmin, "prod": reduce.prod,
    "all": reduce.all, "any": reduce.any,
    # linear algebra
    "matmul": linalg.matmul, "mm": linalg.mm, "addmm": linalg.addmm, "dot": linalg.dot, "mv": linalg.mv,
    "bmm": linalg.bmm, "trace": linalg.trace,
    # nn
    "softmax": nn.softmax, "log_softmax": nn.log_softmax,
})
FUNCTIONS.update(gathers.FUNCTIONS)  # indexing by tensor and ordering
FUNCTIONS.update(gathers.PUBLIC_ONLY)
FUNCTIONS.update(mathops.FUNCTIONS)

# Tensor.<name>: methods that are a public op of the same signature
METHODS = dict(_common.METHODS)
for _name in ("add", "sub", "mul", "div", "pow", "reciprocal", "sign", "clamp", "clip", "eq", "ne", "lt", "le",
              "gt", "ge", "isnan", "logical_not", "allclose", "equal", "reshape", "flatten", "squeeze",
              "unsqueeze", "expand", "permute", "transpose", "swapdims", "swapaxes", "t", "sum", "mean", "amax", "amin", "max", "min",
              "argmax", "argmin", "prod", "matmul", "mm", "addmm", "dot", "mv", "bmm", "trace",
              "softmax", "log_softmax", "narrow", "select", "unbind", "chunk", "split", "split_with_sizes",
              "diagonal", "masked_fill", "all", "any", "diag", "diag_embed", "broadcast_to",
              "unflatten", "ravel", "as_strided"):
    METHODS[_name] = FUNCTIONS[_name]
METHODS.update(gathers.METHODS)
METHODS.update(mathops.METHODS)
METHODS.update({
    "true_divide": elementwise.div, "view": shape.view, "tile": shape.tile_method, "expand_as": shape.expand_as,
    "repeat": shape.repeat,
    "sum_to_size": lambda self, *size: reduce.sum_to(self, size[0] if len(size) == 1 and
                                                      isinstance(size[0], (tuple, list)) else size),
})

for _name, _fn in METHODS.items():
    setattr(Tensor, _name, _fn)
# jitgrad.<name>(..., out=t): the functions (not the methods) take PyTorch's out= keyword
FUNCTIONS.update({_name: out.with_out(_name, _fn) for _name, _fn in FUNCTIONS.items() if _name not in out.NO_OUT})
FUNCTIONS.update({_name: out.with_out(_name, getattr(_tensor, _name), factory=True) for _name in out.FACTORIES})
globals().update(FUNCTIONS)  # jitgrad.ops.<name>
_common._bound[0] = True    # a later defop binds its op at once

from jitgrad.graph.spec import FUNCS as _FUNCS  # noqa: E402
from jitgrad.ops import functional as _F  # noqa: E402
from jitgrad.ops import methods as _methods  # noqa: E402,F401  (operators, in-place ops: after the table)
from jitgrad.ops import sampling, tensorapi  # noqa: E402  (tensor-API methods and random sampling)
from jitgrad.ops.inplace import UNARY as _UNARY_INPLACE  # noqa: E402

FUNCTIONS.update(_UNARY_INPLACE)  # jitgrad.exp_, jitgrad.relu_...: Tensor's in-place forms
tensorapi.install()
for _name, _fn in sampling.METHODS.items():
    setattr(Tensor, _name, _fn)
FUNCTIONS.update(tensorapi.FUNCTIONS)
FUNCTIONS.update(sampling.FUNCTIONS)
FUNCTIONS.update({_name: out.with_out(_name, sampling.FUNCTIONS[_name], factory=True) for _name in ("rand", "randn")})

# forward mode evaluates the elementwise formulas on Tensors with these functions
_forward.NS.update({_name: getattr(_F, _name) for _name in _FUNCS})
