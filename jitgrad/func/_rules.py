"""Batching rules: how each primitive runs on BatchedTensors.

A rule is `rule(ctx, *args, **kwargs)`: the arguments of the public call as the user gave
them (BatchedTensors among them), and `ctx` (a `Call`): the original function `ctx.fn`,
the union of the arguments' levels and helpers. It computes on the physical tensors with
ordinary jitgrad ops (so autograd records through it) and returns the logical result.

`@batch_rule(primitives, public)` registers a rule on the primitives' table entries
(`REGISTRY[name].batch`: every primitive of the table has a rule or the FALLBACK marker,
tests/func/test_vmap_rules.py) and under the public names whose calls it handles
(`jitgrad.<name>`, `nn.functional.<name>`, `Tensor.<name>`). Elementwise primitives get
theirs from broadcasting: every "ew" entry, also one declared later with defop.

A call with no rule loops over the batch (`fallback`): one call of the original per
sample, stacked, with torch's performance warning: slow, never wrong.
"""
import itertools
import warnings

import numpy as np

from jitgrad.func._batched import LEVELS, BatchedTensor, align, as_tensor_like, is_batched, level_size, physical
from jitgrad.graph.spec import REGISTRY
from jitgrad.graph.tensor import Tensor, _rng, _wrap_dim, zeros
from jitgrad.ops import functional as F
from jitgrad.ops.nn import _legacy_reduction

RULES = {}   # public name -> rule


class _Fallback:
    """The marker of a primitive without a batching rule: calls loop over the batch."""

    def __repr__(self):
        return "FALLBACK"


FALLBACK = _Fallback()
# as_strided addresses the storage: a per-sample call sees its own sample's elements only, so the loop over the
# batch either reads the positions the caller meant or raises (it reads nothing of another sample)
REGISTRY["as_strided"].batch = FALLBACK


def batch_rule(primitives=(), public=()):
    def register(rule):
        for name in primitives:
            REGISTRY[name].batch = rule
        for name in public:
            RULES[name] = rule
        return rule
    return register


# --- the call a rule serves ------------------------------------------------------------------
class Call:
    __slots__ = ("name", "fn", "levels", "nb")

    def __init__(self, name, fn, levels):
        self.name, self.fn, self.levels, self.nb = name, fn, levels, len(levels)

    @property
    def sizes(self):
        return tuple(level_size(lvl) for lvl in self.levels)

    def phys(self, x, expand=False):
        """x's physical tensor with all the call's batch dims in front (size 1 where x is not
        batched over a level, unless expand); a non-tensor is returned as is."""
        if is_batched(x) or isinstance(x, Tensor):
            return align(x, self.levels, expand)
        return x

    def padded(self, x, rank):
        """phys(x) with size-1 dims after the batch dims, up to `rank` logical dims, so that
        operands of different ranks broadcast per sample. A plain Tensor stays as it is: it
        broadcasts from the right against the logical dims already."""
        if not is_batched(x):
            return x
        p = self.phys(x)
        for _ in range(rank - x.ndim):
            p = p.unsqueeze(self.nb)
        return p

    def wrap(self, out):
        """A rule's physical result(s) as logical ones (tuples and namedtuples too). A batch dim
        left at size 1 (the result did not depend on that level's operand, expand_as say) is
        expanded: a BatchedTensor's physical batch dims always have their level's size."""
        if isinstance(out, Tensor):
            sizes = self.sizes
            if tuple(out.shape[:self.nb]) != sizes:
                out = out.expand(sizes + tuple(out.shape[self.nb:]))
            return BatchedTensor(out, self.levels)
        if isinstance(out, tuple):
            items = [self.wrap(o) for o in out]
            return type(out)(*items) if hasattr(out, "_fields") else tuple(items)
        return out

    def flat(self, x):
        """x's physical tensor expanded over all levels, with their dims flattened into one."""
        p = self.phys(x, expand=True)
        return p.reshape((-1,) + tuple(p.shape[self.nb:]))

    def unflat(self, p):
        return p.reshape(self.sizes + tuple(p.shape[1:]))


def ndim(x):
    """The logical rank of a tensor argument (0 for a number)."""
    if is_batched(x) or isinstance(x, Tensor):
        return x.ndim
    return 0


def _tensors(args, kwargs):
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from (b for b in a if is_batched(b) or isinstance(b, Tensor))
        elif is_batched(a) or isinstance(a, Tensor):
            yield a


def levels_of(args, kwargs):
    """The sorted union of the levels the arguments are batched over (() if none is)."""
    found = set()
    for a in itertools.chain(args, kwargs.values()):
        if type(a) is BatchedTensor:
            found.update(a._levels)
        elif isinstance(a, (list, tuple)):
            for b in a:
                if type(b) is BatchedTensor:
                    found.update(b._levels)
    return tuple(sorted(found))


def call(name, fn, args, kwargs):
    """Run public op `name` (original function fn) on arguments some of which are batched."""
    if name in RANDOM_OPS:
        return _random_call(name, fn, args, kwargs)
    levels = levels_of(args, kwargs)
    if not levels:
        return fn(*args, **kwargs)
    rule = RULES.get(name)
    ctx = Call(name, fn, levels)
    if rule is None:
        return fallback(ctx, *args, **kwargs)
    return rule(ctx, *args, **kwargs)


# --- the loop over the batch -------------------------------------------------------------
# ops whose result's shape depends on the values: no loop can stack them (torch refuses too)
DYNAMIC = {"nonzero", "argwhere", "unique", "unique_consecutive", "masked_select"}
DYNAMIC_ERROR = ("vmap: We do not support batching operators that can output dynamic shape. Attempted to vmap over "
                 "{}. Please file an issue at https://github.com/pytorch/pytorch/issues if you need this feature.")


def _sample(x, ctx, idx):
    if is_batched(x):
        return ctx.phys(x, expand=True)[idx]
    if isinstance(x, (list, tuple)) and any(is_batched(b) for b in x):
        return type(x)(_sample(b, ctx, idx) for b in x)
    return x


_INPLACE_OPERATORS = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
                      "__imatmul__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"}


def _is_inplace(name):
    return (name.endswith("_") and not name.endswith("__")) or name in _INPLACE_OPERATORS


def fallback(ctx, *args, **kwargs):
    """One call of the original per sample, the results stacked: torch's BatchedFallback. Every
    op without a rule comes here, so every op runs under vmap."""
    warnings.warn(f"There is a performance drop because we have not yet implemented the batching rule for "
                  f"{ctx.name}. Please file us an issue on GitHub so that we can prioritize its implementation.",
                  UserWarning, stacklevel=4)
    return loop(ctx, args, kwargs)


def loop(ctx, args, kwargs, different=None):
    """ctx.fn once per sample of ctx's levels, on each sample's slices of the arguments, and the
    results stacked. An in-place op (or out=) writes into each sample's rows of its target,
    which must be batched over every level. different: the levels a random op draws anew over
    (others get the same draws: the generator is rewound), None for an op that draws nothing."""
    if ctx.name in DYNAMIC:
        raise RuntimeError(DYNAMIC_ERROR.format(ctx.name))
    target = kwargs.get("out") if kwargs.get("out") is not None else args[0] if _is_inplace(ctx.name) else None
    if target is not None:
        if different and not set(different) <= set(target._levels if is_batched(target) else ()):
            raise RuntimeError("vmap: Cannot ask for different inplace randomness on an unbatched tensor. This will "
                               "appear like same randomness. If this is necessary for your usage, please file an "
                               "issue with functorch.")
        _check_inplace(ctx, target, arithmetic=False)
    rewind = _Rewind(ctx.levels, different, kwargs.get("generator")) if different is not None else None
    outs = []
    for idx in itertools.product(*(range(s) for s in ctx.sizes)):
        if rewind is not None:
            rewind.before(idx)
        sample_args = [_sample(a, ctx, idx) for a in args]
        sample_kwargs = {k: _sample(v, ctx, idx) for k, v in kwargs.items()}
        out = ctx.fn(*sample_args, **sample_kwargs)
        if target is not None:
            written = sample_kwargs["out"] if kwargs.get("out") is not None else sample_args[0]
            if tuple(written.shape) != tuple(target.shape):
                # an in-place view op (t_, transpose_...) changed a sample's view, not the batch
                raise RuntimeError(f"vmap: {ctx.name} changes the shape of its batched tensor in place, which has no "
                                   "batching rule; use the out-of-place op instead")
        outs.append(out)
        if rewind is not None:
            rewind.after(idx)
    if rewind is not None:
        rewind.finish()
    if target is not None:
        return target
    return _stacked(ctx, outs)


def _stacked(ctx, outs):
    """The per-sample results (tensors, or tuples / lists / namedtuples of them) as logical ones."""
    first = outs[0] if outs else None
    if isinstance(first, Tensor):
        _check_same_shapes(ctx, outs)
        return ctx.wrap(ctx.unflat(F.stack(outs)))
    if isinstance(first, (tuple, list)) and first and all(isinstance(o, Tensor) for o in first):
        parts = []
        for k in range(len(first)):
            column = [o[k] for o in outs]
            _check_same_shapes(ctx, column)
            parts.append(BatchedTensor(ctx.unflat(F.stack(column)), ctx.levels))
        return type(first)(*parts) if hasattr(first, "_fields") else type(first)(parts)
    if first is None and not outs:
        raise RuntimeError(f"vmap: {ctx.name}: cannot loop over a batch of size 0")
    raise RuntimeError(f"Batching rule not implemented for {ctx.name}. We could not generate a fallback: it "
                       f"returned {type(first).__name__}, not Tensors, and that value depends on the samples "
                       "(data-dependent), which vmap does not support.")


def _check_same_shapes(ctx, tensors):
    shape = tuple(tensors[0].shape)
    if any(tuple(t.shape) != shape for t in tensors):
        raise RuntimeError(DYNAMIC_ERROR.format(ctx.name))


class _Rewind:
    """vmap's randomness flag in a loop: samples that differ only along 'same' levels get the
    same draws (the generator is rewound to where the first of them started), those that
    differ along a 'different' level draw anew; afterwards the generator is where the last
    fresh draw left it."""

    def __init__(self, levels, different, generator):
        self.keep = [k for k, lvl in enumerate(levels) if lvl in different]
        if generator is not None:
            self.get, self.set = generator.get_state, generator.set_state
        else:
            self.get, self.set = _rng[0].snapshot, _rng[0].restore
        self.starts, self.end = {}, None

    def before(self, idx):
        key = tuple(idx[k] for k in self.keep)
        if key in self.starts:
            self.fresh = False
            self.set(self.starts[key])
        else:
            self.fresh = True
            self.starts[key] = self.get()

    def after(self, idx):
        if self.fresh:
            self.end = self.get()

    def finish(self):
        if self.end is not None:
            self.set(self.end)


def _random_call(name, fn, args, kwargs):
    """A random op inside vmap: an error in 'error' mode; else one draw per sample of the
    'different' levels and of the arguments' levels, the same draws along 'same' levels."""
    different = random_levels()
    own = levels_of(args, kwargs)
    if set(own) - set(different) and not _is_inplace(name) and not name.endswith("_like"):
        raise RuntimeError("Vmap does not currently support same randomness with a batched tensor input. Please "
                           "file an issue with functorch")
    levels = tuple(sorted(set(own) | set(different)))
    if not levels:
        return fn(*args, **kwargs)
    return loop(Call(name, fn, levels), args, kwargs, different)


# --- what reads only metadata: the logical tensor's -------------------------------------------------
@batch_rule(public=("is_tensor",))
def _is_tensor(ctx, x):
    return True


@batch_rule(public=("numel", "nelement"))
def _numel(ctx, x):
    return x.numel()


@batch_rule(public=("element_size", "get_device", "is_inference", "is_floating_point", "is_complex"))
def _physical_metadata(ctx, x):
    return ctx.fn(physical(x))


@batch_rule(public=("stride",))
def _stride(ctx, x, dim=None):
    """A BatchedTensor is contiguous (is_contiguous()): its logical strides."""
    strides, n = [], 1
    for s in reversed(tuple(x.shape)):
        strides.insert(0, n)
        n *= max(s, 1)
    return tuple(strides) if dim is None else strides[_wrap_dim(dim, len(strides))]


@batch_rule(public=("storage_offset",))
def _storage_offset(ctx, x):
    return 0


@batch_rule(public=("data_ptr", "untyped_storage"))
def _no_storage(ctx, x):
    raise RuntimeError("Cannot access data pointer of Tensor that doesn't have storage")


# --- elementwise: broadcasting ------------------------------------------------------------------
def _ew(ctx, *args, **kwargs):
    rank = max(ndim(t) for t in _tensors(args, kwargs))
    out = ctx.fn(*[ctx.padded(a, rank) for a in args], **{k: ctx.padded(v, rank) for k, v in kwargs.items()})
    return ctx.wrap(out)


EW_PUBLIC = (
    "add", "sub", "rsub", "mul", "div", "true_divide", "pow", "reciprocal", "neg", "exp", "log", "log1p", "expm1",
    "sqrt", "sin", "cos", "tanh", "erf", "sigmoid", "relu", "abs", "clone", "sign", "clamp", "clip", "maximum",
    "minimum", "atan2", "arctan2", "asin", "arcsin", "acos", "arccos", "atan", "arctan", "where", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not",
    "isnan", "isfinite", "gelu", "to", "long", "float", "double", "type", "detach", "contiguous", "cpu", "cuda",
    "zeros_like", "ones_like", "empty_like", "full_like", "retain_grad", "register_hook", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__pow__", "__rpow__", "__neg__", "__abs__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__",
    "__ge__", "__and__", "__or__", "__xor__", "__invert__",
)
batch_rule(primitives=[s for s, spec in REGISTRY.items() if spec.kind == "ew" and s not in
                       ("fill", "fill_tensor", "zero", "copy")], public=EW_PUBLIC)(_ew)
batch_rule(primitives=("to_copy", "to_device"))(_ew)


def register_elementwise(names):
    """Elementwise primitives and public ops declared after import (defop) batch by broadcasting."""
    for spec in REGISTRY.values():
        if spec.kind == "ew" and spec.batch is None:
            spec.batch = _ew
    for name in names:
        RULES.setdefault(name, _ew)


# --- in-place ops --------------------------------------------------------------------------------
INPLACE_ERROR = ("vmap: inplace arithmetic(self, *extra_args) is not possible because there exists a Tensor "
                 "`other` in extra_args that has more elements than `self`. This happened due to `other` being "
                 "vmapped over but `self` not being vmapped over in a vmap. Please try to use out-of-place "
                 "operators instead of inplace arithmetic. If said operator is being called inside the PyTorch "
                 "framework, please file a bug report instead.")


def _check_inplace(ctx, self, arithmetic=True):
    if not is_batched(self) or self._levels != ctx.levels:
        raise RuntimeError(INPLACE_ERROR if arithmetic else INPLACE_ERROR.replace("inplace arithmetic", ctx.name, 1)
                           .replace("instead of inplace arithmetic", f"instead of {ctx.name}"))


@batch_rule(primitives=("fill", "fill_tensor", "zero", "copy"),
            public=("add_", "sub_", "mul_", "div_", "clamp_", "copy_", "fill_", "zero_", "__iadd__", "__isub__",
                    "__imul__", "__itruediv__"))
def _inplace(ctx, self, *args, **kwargs):
    """self's physical tensor is written in place: self must be batched over every level of
    the call (else torch's error); the other operands broadcast into each sample."""
    _check_inplace(ctx, self)
    if ctx.name == "fill_" and any(is_batched(a) for a in args):      # a 0-d value per sample
        self._phys.copy_(ctx.padded(args[0], self.ndim).expand(tuple(self._phys.shape)))
        return self
    rank = self.ndim
    ctx.fn(self._phys, *[ctx.padded(a, rank) for a in args], **{k: ctx.padded(v, rank) for k, v in kwargs.items()})
    return self


# --- dims: logical -> physical ---------------------------------------------------------------
def _pdim(ctx, d, rank):
    return _wrap_dim(d, rank) + ctx.nb


def _reduced_dims(ctx, x, dim):
    """The physical dims a reduction over logical `dim` (None or (): all) covers."""
    r = x.ndim
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return tuple(range(ctx.nb, ctx.nb + r))
    if isinstance(dim, (tuple, list)):
        return tuple(_pdim(ctx, d, r) for d in dim)
    return _pdim(ctx, dim, r)


def _scalar_as_vector(ctx, x):
    """A logical 0-d x reduces like a 1-element vector: its physical value with one more dim."""
    p = ctx.phys(x)
    return (p.unsqueeze(-1), True) if x.ndim == 0 else (p, False)


# --- reductions ------------------------------------------------------------------------------
@batch_rule(primitives=("sum", "sum_all", "mean", "mean_all", "amax", "amin"),
            public=("sum", "mean", "amax", "amin"))
def _reduce(ctx, x, dim=None, keepdim=False, **kwargs):
    p, lifted = _scalar_as_vector(ctx, x)
    if lifted:      # a logical 0-d x: any dim (0 or -1, or all) is its one element
        return ctx.wrap(ctx.fn(p, ctx.nb, False, **kwargs))
    return ctx.wrap(ctx.fn(p, _reduced_dims(ctx, x, dim), keepdim, **kwargs))


def _flatten_logical(ctx, x):
    p = ctx.phys(x)
    return p.reshape(tuple(p.shape[:ctx.nb]) + (-1,))


@batch_rule(primitives=("prod", "prod_all"), public=("prod",))
def _prod(ctx, x, dim=None, keepdim=False, dtype=None):
    if dim is None:
        out = ctx.fn(_flatten_logical(ctx, x), ctx.nb, False, dtype=dtype)
        return ctx.wrap(out)
    p, lifted = _scalar_as_vector(ctx, x)
    return ctx.wrap(ctx.fn(p, _pdim(ctx, dim, max(x.ndim, 1)), keepdim and not lifted, dtype=dtype))


@batch_rule(primitives=("max_all", "min_all", "max_dim", "min_dim"), public=("max", "min"))
def _extremum(ctx, x, dim=None, keepdim=False):
    if isinstance(dim, (Tensor, BatchedTensor)):            # max(a, b): elementwise
        return _ew(ctx, x, dim)
    if dim is None:
        amax = F.amax if ctx.name == "max" else F.amin
        return ctx.wrap(amax(ctx.phys(x), _reduced_dims(ctx, x, None)) if x.ndim else ctx.phys(x) * 1)
    p, lifted = _scalar_as_vector(ctx, x)
    return ctx.wrap(ctx.fn(p, _pdim(ctx, dim, max(x.ndim, 1)), keepdim and not lifted))


@batch_rule(public=("argmax", "argmin"))
def _argextremum(ctx, x, dim=None, keepdim=False):
    if dim is None:
        out = ctx.fn(_flatten_logical(ctx, x), ctx.nb, False)
        if keepdim:
            out = out.reshape(tuple(out.shape) + (1,) * x.ndim)
        return ctx.wrap(out)
    p, lifted = _scalar_as_vector(ctx, x)
    return ctx.wrap(ctx.fn(p, _pdim(ctx, dim, max(x.ndim, 1)), keepdim and not lifted))


@batch_rule(primitives=("softmax", "log_softmax"), public=("softmax", "log_softmax"))
def _softmax(ctx, x, dim=None, dtype=None, **kwargs):
    p, lifted = _scalar_as_vector(ctx, x)
    out = ctx.fn(p, _pdim(ctx, dim, max(x.ndim, 1)), dtype=dtype)
    return ctx.wrap(out.squeeze(-1) if lifted else out)


@batch_rule(primitives=("trace",), public=("trace",))
def _trace(ctx, x):
    if x.ndim != 2:
        raise RuntimeError("trace: expected a matrix, but got tensor with dim " + str(x.ndim))
    n, m = x.shape
    p = ctx.phys(x)
    mask = F._wrap(np.eye(n, m, dtype=p._data.dtype))
    return ctx.wrap((p * mask).sum((-2, -1)))


@batch_rule(public=("sum_to_size",))
def _sum_to_size(ctx, x, *size):
    size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    p = ctx.phys(x)
    lead = x.ndim - len(size)
    dims = tuple(range(ctx.nb, ctx.nb + lead)) + tuple(ctx.nb + lead + i for i, s in enumerate(size)
                                                       if s == 1 and x.shape[lead + i] != 1)
    out = p.sum(dims, keepdim=True) if dims else p
    return ctx.wrap(out.reshape(tuple(p.shape[:ctx.nb]) + size))


# --- views and shapes ------------------------------------------------------------------------
def _shape(args):
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)


@batch_rule(primitives=("view", "unsafe_view"), public=("reshape", "view"))
def _reshape(ctx, x, *shape):
    p = ctx.phys(x)
    return ctx.wrap(ctx.fn(p, tuple(p.shape[:ctx.nb]) + _shape(shape)))


@batch_rule(public=("view_as", "reshape_as"))
def _reshape_as(ctx, x, other):
    p = ctx.phys(x)
    return ctx.wrap(p.reshape(tuple(p.shape[:ctx.nb]) + tuple(other.shape)))


@batch_rule(public=("flatten",))
def _flatten(ctx, x, start_dim=0, end_dim=-1):
    p = ctx.phys(x)
    if x.ndim == 0:
        return ctx.wrap(p.reshape(tuple(p.shape[:ctx.nb]) + (1,)))
    return ctx.wrap(ctx.fn(p, _pdim(ctx, start_dim, x.ndim), _pdim(ctx, end_dim, x.ndim)))


@batch_rule(primitives=("squeeze", "squeeze_dim"), public=("squeeze",))
def _squeeze(ctx, x, dim=None):
    p = ctx.phys(x)
    if x.ndim == 0:
        return ctx.wrap(p * 1 if dim is None else ctx.fn(p.unsqueeze(-1), -1).reshape(p.shape))
    if dim is None:
        dims = tuple(ctx.nb + i for i, s in enumerate(x.shape) if s == 1)
        return ctx.wrap(ctx.fn(p, dims) if dims else ctx.fn(p, ()))
    return ctx.wrap(ctx.fn(p, _reduced_dims(ctx, x, dim)))


@batch_rule(primitives=("unsqueeze",), public=("unsqueeze",))
def _unsqueeze(ctx, x, dim):
    return ctx.wrap(ctx.fn(ctx.phys(x), _pdim(ctx, dim, x.ndim + 1)))


@batch_rule(primitives=("expand",), public=("expand",))
def _expand(ctx, x, *sizes):
    sizes = _shape(sizes)
    p = ctx.phys(x)
    if len(sizes) < x.ndim:
        return ctx.fn(F.zeros_like(p.reshape(tuple(x.shape))), sizes)  # torch's error for too few sizes
    for _ in range(len(sizes) - x.ndim):
        p = p.unsqueeze(ctx.nb)
    return ctx.wrap(ctx.fn(p, tuple(p.shape[:ctx.nb]) + sizes))


@batch_rule(public=("expand_as",))
def _expand_as(ctx, x, other):
    return _expand(Call("expand", F.expand, ctx.levels), x, tuple(other.shape))


@batch_rule(primitives=("permute",), public=("permute",))
def _permute(ctx, x, *dims):
    dims = _shape(dims)
    if len(dims) != x.ndim:
        return ctx.fn(F.zeros_like(ctx.phys(x).reshape(tuple(x.shape))), dims)  # torch's error
    return ctx.wrap(ctx.fn(ctx.phys(x), tuple(range(ctx.nb)) + tuple(_pdim(ctx, d, x.ndim) for d in dims)))


@batch_rule(primitives=("transpose",), public=("transpose",))
def _transpose(ctx, x, dim0, dim1):
    r = x.ndim
    return ctx.wrap(ctx.fn(ctx.phys(x), _pdim(ctx, dim0, r), _pdim(ctx, dim1, r)) if r else ctx.phys(x) * 1)


@batch_rule(primitives=("split", "split_with_sizes", "unbind"),
            public=("narrow", "select", "split", "split_with_sizes", "chunk", "unbind"))
def _dim_view(ctx, x, *args, dim=None):
    """narrow(x, dim, start, length), select(x, dim, index), unbind(x, dim=0): dim first;
    split(x, size, dim=0), chunk(x, n, dim=0): dim second. The same op on the physical tensor."""
    first = ctx.name in ("narrow", "select")
    if dim is None:
        at = 0 if first or ctx.name == "unbind" else 1
        dim = args[at] if len(args) > at else 0
        args = args[:at] + args[at + 1:]
    dim = _pdim(ctx, dim, x.ndim)
    out = ctx.fn(ctx.phys(x), dim, *args) if first else ctx.fn(ctx.phys(x), *args, dim=dim)
    return ctx.wrap(out)


@batch_rule(public=("masked_fill",))
def _masked_fill(ctx, x, mask, value):
    """The op broadcasts x and the mask (where's rule): both padded to one rank."""
    if is_batched(value):  # a 0-d value per sample
        return fallback(ctx, x, mask, value)
    rank = max(ndim(x), ndim(mask))
    return ctx.wrap(ctx.fn(ctx.padded(x, rank), ctx.padded(mask, rank), value))


@batch_rule(primitives=("diagonal",), public=("diagonal",))
def _diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    if x.ndim < 2:
        return ctx.fn(F.zeros_like(ctx.phys(x).reshape(tuple(x.shape))), offset, dim1, dim2)  # torch's error
    return ctx.wrap(ctx.fn(ctx.phys(x), offset, _pdim(ctx, dim1, x.ndim), _pdim(ctx, dim2, x.ndim)))


@batch_rule(primitives=("repeat",), public=("repeat",))
def _repeat(ctx, x, *repeats):
    reps = _shape(repeats)
    if len(reps) < x.ndim:
        return ctx.fn(F.zeros_like(ctx.phys(x).reshape(tuple(x.shape))), reps)  # torch's error
    p = ctx.padded(x, len(reps))
    return ctx.wrap(ctx.fn(p, (1,) * ctx.nb + reps))


@batch_rule(public=("tile",))
def _tile(ctx, x, *dims):
    """torch.tile(x, dims) and Tensor.tile(*dims): the physical tensor repeated, the batch dims once."""
    if len(dims) == 1 and not isinstance(dims[0], (tuple, list)) and ctx.fn is not F.tile_method:
        return ctx.fn(F.zeros_like(ctx.phys(x).reshape(tuple(x.shape))), *dims)  # torch's error
    reps = _shape(dims)
    reps = (1,) * (x.ndim - len(reps)) + tuple(reps)
    return ctx.wrap(ctx.padded(x, len(reps)).repeat((1,) * ctx.nb + reps))


@batch_rule(primitives=("diag",), public=("diag",))
def _diag(ctx, x, diagonal=0):
    """A vector per sample becomes a matrix (diag_embed over its last dim), a matrix's
    diagonal a vector (a copy, as torch's diag)."""
    if x.ndim == 1:
        return ctx.wrap(F.diag_embed(ctx.phys(x), diagonal, -2, -1))
    if x.ndim != 2:
        return ctx.fn(F.zeros_like(ctx.phys(x).reshape(tuple(x.shape))), diagonal)  # torch's error
    return ctx.wrap(ctx.phys(x).diagonal(diagonal, -2, -1).clone())


@batch_rule(primitives=("diag_embed",), public=("diag_embed",))
def _diag_embed(ctx, x, offset=0, dim1=-2, dim2=-1):
    if x.ndim == 0:
        return ctx.fn(F.zeros_like(ctx.phys(x).reshape(())), offset, dim1, dim2)  # torch's error
    r = x.ndim + 1
    return ctx.wrap(ctx.fn(ctx.phys(x), offset, _pdim(ctx, dim1, r), _pdim(ctx, dim2, r)))


@batch_rule(primitives=("t",), public=("t",))
def _t(ctx, x):
    if x.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {x.ndim}D")
    p = ctx.phys(x)
    return ctx.wrap(p.transpose(ctx.nb, ctx.nb + 1) if x.ndim == 2 else p * 1)


@batch_rule(public=("t_", "transpose_", "swapdims_", "swapaxes_"))
def _transpose_inplace(ctx, x, *dims):
    """The in-place view ops transpose the physical tensor, past the batch dims."""
    _check_inplace(ctx, x)
    r = x.ndim
    if ctx.name == "t_":
        if r > 2:
            raise RuntimeError(f"t_() expects a tensor with <= 2 dimensions, but self is {r}D")
        dims = (0, 1) if r == 2 else ()
    if dims:
        x._phys.transpose_(_pdim(ctx, dims[0], r), _pdim(ctx, dims[1], r))
    return x


@batch_rule(public=("squeeze_", "unsqueeze_"))
def _squeeze_inplace(ctx, x, dim=None):
    """As squeeze/unsqueeze, on the physical tensor in place."""
    _check_inplace(ctx, x)
    p = x._phys
    if ctx.name == "unsqueeze_":
        p.unsqueeze_(_pdim(ctx, dim, x.ndim + 1))
    elif x.ndim:
        p.squeeze_(tuple(ctx.nb + i for i, s in enumerate(x.shape) if s == 1) if dim is None
                   else _reduced_dims(ctx, x, dim))
    return x


def logical_T(x):
    nb, r = len(x._levels), x.ndim
    return BatchedTensor(x._phys.permute(tuple(range(nb)) + tuple(range(nb + r - 1, nb - 1, -1))), x._levels)


def logical_mT(x):
    if x.ndim < 2:
        raise RuntimeError(f"tensor.mT is only supported on matrices or batches of matrices. Got {x.ndim}-D tensor.")
    return BatchedTensor(x._phys.transpose(-2, -1), x._levels)


# --- joining --------------------------------------------------------------------------------
@batch_rule(primitives=("cat", "stack"), public=("cat", "stack", "concat", "concatenate"))
def _join(ctx, tensors, dim=0):
    tensors = list(tensors)
    stacking = ctx.name == "stack"
    r = tensors[0].ndim
    if not stacking and r == 0:
        raise RuntimeError("zero-dimensional tensor (at position 0) cannot be concatenated")
    d = _pdim(ctx, dim, r + 1 if stacking else r)
    return ctx.wrap(ctx.fn([ctx.phys(t, expand=True) for t in tensors], d))


# --- indexing ---------------------------------------------------------------------------------
def _index_parts(index):
    return index if isinstance(index, tuple) else (index,)


def _is_advanced(i):
    return is_batched(i) or isinstance(i, (Tensor, list, np.ndarray))


def _advanced_dims(parts):
    """The number of dims numpy's advanced indices (index arrays and, beside them, ints) make."""
    shapes = []
    for i in parts:
        if isinstance(i, (Tensor, list, np.ndarray)):
            a = np.asarray(i._data if isinstance(i, Tensor) else i)
            shapes.extend([(int(a.sum()),)] if a.dtype == bool else [a.shape])
        elif isinstance(i, (int, np.integer)):
            shapes.append(())
    return len(np.broadcast_shapes(*shapes))


def _is_bool(i):
    return (is_batched(i) or isinstance(i, Tensor)) and physical(i)._data.dtype == np.bool_


def _physical_index(ctx, x, index):
    """(physical index, fix, gather) for logical `index` of x: fix(result) moves the batch dims
    back in front; gather: the index picks per sample (x must be expanded over every level).
    (None, None, False): no rule, loop over the batch."""
    parts = _index_parts(index)
    if any(is_batched(i) for i in parts):
        return _gather_index(ctx, parts)
    pidx = (slice(None),) * ctx.nb + parts
    adv = [k for k, i in enumerate(parts) if _is_advanced(i) or isinstance(i, (int, np.integer))]
    if any(_is_advanced(i) for i in parts) and adv[-1] - adv[0] + 1 != len(adv):
        # numpy puts the dims of non-adjacent advanced indices first, before the batch dims
        a, nb = _advanced_dims(parts), ctx.nb

        def fix(out):
            return out.permute(tuple(range(a, a + nb)) + tuple(range(a)) + tuple(range(a + nb, out.ndim)))
        return pidx, fix, False
    return pidx, None, False


def _gather_index(ctx, parts):
    """An index of integer tensors and ints only, some batched: each sample picks with its
    own index, through one arange index per batch dim in front (all advanced, so numpy keeps
    their dims there)."""
    if not all(_is_advanced(i) or isinstance(i, (int, np.integer)) for i in parts) or any(map(_is_bool, parts)):
        return None, None, False
    parts = [F._wrap(np.asarray(i)) if isinstance(i, (list, np.ndarray)) else i for i in parts]
    rank = max(ndim(i) for i in parts)
    ar = []
    for k, s in enumerate(ctx.sizes):
        shape = [1] * (ctx.nb + rank)
        shape[k] = s
        ar.append(F._wrap(np.arange(s, dtype=np.int64).reshape(shape)))
    return tuple(ar) + tuple(ctx.padded(i, rank) for i in parts), None, True


@batch_rule(primitives=("index", "select", "slice"), public=("__getitem__",))
def _getitem(ctx, x, index):
    if any(is_batched(i) and _is_bool(i) for i in _index_parts(index)):
        raise RuntimeError("vmap: We do not support batching operators that can support dynamic shape. Attempting "
                           "to batch over indexing with a boolean mask.")
    pidx, fix, gather = _physical_index(ctx, x, index)
    if pidx is None:
        return fallback(ctx, x, index)
    out = ctx.fn(ctx.phys(x, expand=gather), pidx)
    return ctx.wrap(fix(out) if fix is not None else out)


@batch_rule(primitives=("index_put",), public=("__setitem__",))
def _setitem(ctx, x, index, value):
    _check_inplace(ctx, x)
    pidx, fix, _ = _physical_index(ctx, x, index)
    if pidx is None or fix is not None:
        # per sample: each writes into its own rows of x's physical tensor (a view)
        for idx in itertools.product(*(range(s) for s in ctx.sizes)):
            ctx.fn(x._phys[idx], _sample_index(ctx, index, idx), _sample(value, ctx, idx))
        return None
    if is_batched(value):
        region = np.empty(tuple(x._phys.shape), np.int8)[tuple(physical(i)._data if isinstance(physical(i), Tensor)
                                                              else i for i in pidx)]
        value = ctx.padded(value, region.ndim - ctx.nb)
    ctx.fn(x._phys, pidx, value)
    return None


def _sample_index(ctx, index, idx):
    parts = _index_parts(index)
    return tuple(_sample(i, ctx, idx) for i in parts) if isinstance(index, tuple) else _sample(index, ctx, idx)


# --- linear algebra -----------------------------------------------------------------------------
@batch_rule(primitives=("matmul", "dot", "mv", "bmm"), public=("matmul", "mm", "bmm", "mv", "dot", "__matmul__"))
def _matmul(ctx, a, b):
    ra, rb = ndim(a), ndim(b)
    _check_matmul_ranks(ctx.name, ra, rb)
    if not is_batched(b) and rb == 2 and ra >= 1:
        return ctx.wrap(F.matmul(ctx.phys(a), b))        # the common case: one matrix for every sample
    pa, pb = ctx.phys(a), ctx.phys(b)
    if ra == 1:
        pa = pa.unsqueeze(-2)
    if rb == 1:
        pb = pb.unsqueeze(-1)
    rank = max(ra, rb, 2)
    for _ in range(rank - max(ra, 2)):
        pa = pa.unsqueeze(ctx.nb)
    for _ in range(rank - max(rb, 2)):
        pb = pb.unsqueeze(ctx.nb)
    out = F.matmul(pa, pb)
    if rb == 1:
        out = out.squeeze(-1)
    if ra == 1:
        out = out.squeeze(-1 if rb == 1 else -2)
    return ctx.wrap(out)


_RANKS = {"mm": (2, 2, "self must be a matrix"), "bmm": (3, 3, "batch1 must be a 3D tensor"),
          "mv": (2, 1, "vector + matrix @ vector expected"), "dot": (1, 1, "1D tensors expected")}


def _check_matmul_ranks(name, ra, rb):
    want = _RANKS.get(name)
    if want is not None and (ra, rb) != want[:2]:
        if name == "dot":
            raise RuntimeError(f"1D tensors expected, but got {ra}D and {rb}D tensors")
        raise RuntimeError(want[2])
    if ra == 0 or rb == 0:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {ra}D and {rb}D")


@batch_rule(public=("__rmatmul__",))
def _rmatmul(ctx, a, b):
    return _matmul(Call("matmul", F.matmul, ctx.levels), b, a)


@batch_rule(primitives=("addmm", "linear_mm"), public=("addmm", "linear"))
def _linear(ctx, *args, **kwargs):
    if ctx.name == "linear":
        x, w, bias = (list(args) + [kwargs.get("weight"), kwargs.get("bias")])[:3] if len(args) < 3 else args
        if "input" in kwargs:
            x = kwargs["input"]
        if not is_batched(w) and not is_batched(bias) and ndim(x) >= 1:
            return ctx.wrap(F.linear(ctx.phys(x), w, bias))
        mm = Call("matmul", F.matmul, ctx.levels)
        if ndim(x) == 2 and ndim(w) == 2:
            # a weight per sample (grad inside vmap): (w @ x^T)^T reads w in its own layout, so
            # neither the forward nor the saved operand copies a transposed [B, out, in] weight,
            # and the weight's gradient comes out in the leaf's layout
            out = _mT(_matmul(mm, w, _mT(x)))
        else:
            out = _matmul(mm, x, _mT(w))
        return out if bias is None else out + bias
    inp, m1, m2 = args[:3]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    prod = _matmul(Call("mm", F.mm, ctx.levels), m1, m2)
    return inp * beta + prod * alpha


def _mT(w):
    return logical_mT(w) if is_batched(w) else w.transpose(-2, -1)


# --- nn ---------------------------------------------------------------------------------------
@batch_rule(primitives=("convolution",), public=("conv2d",))
def _conv2d(ctx, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    unbatched_input = ndim(input) == 3
    if not is_batched(weight) and not is_batched(bias):
        p = ctx.phys(input)
        folded = p.reshape((-1,) + tuple(p.shape[-3:]))
        out = ctx.fn(folded, weight, bias, stride, padding, dilation, groups)
        lead = tuple(p.shape[:ctx.nb + (0 if unbatched_input else 1)])
        return ctx.wrap(out.reshape(lead + tuple(out.shape[1:])))
    # a weight per sample: the samples become groups of one convolution
    x = ctx.flat(input)                                   # [B, (N,) C, H, W]
    if unbatched_input:
        x = x.unsqueeze(1)
    nbatch, n, c = x.shape[0], x.shape[1], x.shape[2]
    x = x.transpose(0, 1).reshape((n, nbatch * c) + tuple(x.shape[3:]))
    w = ctx.flat(weight)                                  # [B, Cout, C/g, kh, kw]
    cout = w.shape[1]
    w = w.reshape((nbatch * cout,) + tuple(w.shape[2:]))
    b = None if bias is None else ctx.flat(bias).reshape(nbatch * cout)
    out = ctx.fn(x, w, b, stride, padding, dilation, groups * nbatch)     # [N, B*Cout, Ho, Wo]
    out = out.reshape((n, nbatch, cout) + tuple(out.shape[2:])).transpose(0, 1)
    if unbatched_input:
        out = out.squeeze(1)
    return ctx.wrap(ctx.unflat(out))


@batch_rule(public=("conv_transpose2d",))
def _conv_transpose2d(ctx, input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    geometry = (stride, padding, output_padding)
    unbatched_input = ndim(input) == 3
    if not is_batched(weight) and not is_batched(bias):
        p = ctx.phys(input)
        out = ctx.fn(p.reshape((-1,) + tuple(p.shape[-3:])), weight, bias, *geometry, groups, dilation)
        lead = tuple(p.shape[:ctx.nb + (0 if unbatched_input else 1)])
        return ctx.wrap(out.reshape(lead + tuple(out.shape[1:])))
    # a weight per sample: the samples become groups of one transposed convolution, as in conv2d's rule
    x = ctx.flat(input)                                   # [B, (N,) Cin, H, W]
    if unbatched_input:
        x = x.unsqueeze(1)
    nbatch, n, c = x.shape[0], x.shape[1], x.shape[2]
    x = x.transpose(0, 1).reshape((n, nbatch * c) + tuple(x.shape[3:]))
    w = ctx.flat(weight)                                  # [B, Cin, Cout/g, kh, kw]
    w = w.reshape((nbatch * c,) + tuple(w.shape[2:]))
    cout = w.shape[1] * groups
    b = None if bias is None else ctx.flat(bias).reshape(nbatch * cout)
    out = ctx.fn(x, w, b, *geometry, groups * nbatch, dilation)      # [N, B*Cout, Ho, Wo]
    out = out.reshape((n, nbatch, cout) + tuple(out.shape[2:])).transpose(0, 1)
    if unbatched_input:
        out = out.squeeze(1)
    return ctx.wrap(ctx.unflat(out))


@batch_rule(primitives=("max_pool2d",), public=("max_pool2d",))
def _max_pool2d(ctx, input, *args, **kwargs):
    p = ctx.phys(input)
    lead = tuple(p.shape[:-3])
    out = ctx.fn(p.reshape((-1,) + tuple(p.shape[-3:])), *args, **kwargs)

    def back(o):
        return o.reshape(lead + tuple(o.shape[1:]))
    return ctx.wrap(tuple(back(o) for o in out) if isinstance(out, tuple) else back(out))


@batch_rule(primitives=("avg_pool2d", "adaptive_avg_pool2d"), public=("avg_pool2d", "adaptive_avg_pool2d"))
def _avg_pool2d(ctx, input, *args, **kwargs):
    return _max_pool2d(ctx, input, *args, **kwargs)  # the same: over planes, whatever lies before them


@batch_rule(primitives=("group_norm",), public=("group_norm",))
def _group_norm(ctx, input, num_groups, weight=None, bias=None, eps=1e-5):
    """Per sample: the batch dims join N, unless weight or bias are batched."""
    if is_batched(weight) or is_batched(bias):
        return fallback(ctx, input, num_groups, weight, bias, eps)
    p = ctx.phys(input, expand=True)
    nb = ctx.nb
    out = ctx.fn(p.reshape((-1,) + tuple(p.shape[nb + 1:])), num_groups, weight, bias, eps)
    return ctx.wrap(out.reshape(tuple(p.shape)))


@batch_rule(primitives=("batch_norm",), public=("batch_norm",))
def _batch_norm(ctx, *args, **kwargs):
    # statistics over the batch of each sample, and running statistics updated in place
    return fallback(ctx, *args, **kwargs)


@batch_rule(primitives=("reflection_pad2d", "replication_pad2d"), public=("_pad2d",))
def _pad2d(ctx, x, pads, mode):
    return ctx.wrap(ctx.fn(ctx.phys(x), pads, mode))


@batch_rule(primitives=("constant_pad_nd", "reflection_pad1d", "replication_pad1d", "reflection_pad3d",
                        "replication_pad3d"), public=("pad",))
def _pad(ctx, x, pad, mode="constant", value=None):
    """F.pad pads trailing dims: the physical tensor, with its batch dims merged into the first
    unpadded one (the non-constant modes take inputs of k + 1 or k + 2 dims only)."""
    k = len(pad) // 2 if isinstance(pad, (tuple, list)) else 0
    if mode == "constant" or not 1 <= k <= 3 or x.ndim not in (k + 1, k + 2):
        if k > x.ndim or mode != "constant":  # torch's error, from the logical shape
            return ctx.fn(F.zeros_like(ctx.phys(x).reshape(tuple(x.shape))), pad, mode, value)
        return ctx.wrap(ctx.fn(ctx.phys(x), pad, mode, value))
    p = ctx.phys(x, expand=True)
    flat = p.reshape((-1,) + tuple(p.shape[-(k + 1):]))
    out = ctx.fn(flat, pad, mode, value)
    return ctx.wrap(out.reshape(tuple(p.shape[:-(k + 1)]) + tuple(out.shape[1:])))


@batch_rule(primitives=("layer_norm",), public=("layer_norm",))
def _layer_norm(ctx, input, normalized_shape, weight=None, bias=None, eps=1e-5):
    if not is_batched(weight) and not is_batched(bias):
        return ctx.wrap(ctx.fn(ctx.phys(input), normalized_shape, weight, bias, eps))
    out = ctx.wrap(ctx.fn(ctx.phys(input, expand=True), normalized_shape, None, None, eps))
    if weight is not None:
        out = out * weight
    return out if bias is None else out + bias


@batch_rule(primitives=("embedding",), public=("embedding",))
def _embedding(ctx, input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
               sparse=False):
    if not is_batched(weight):
        return ctx.wrap(ctx.fn(ctx.phys(input), weight, padding_idx, max_norm, norm_type, scale_grad_by_freq,
                               sparse))
    if max_norm is not None or scale_grad_by_freq:
        return fallback(ctx, input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
    w = ctx.flat(weight)                                  # [B, V, D]
    idx = ctx.flat(input)                                 # [B, ...]
    ar = F._wrap(np.arange(w.shape[0], dtype=np.int64).reshape((-1,) + (1,) * (idx.ndim - 1)))
    out = w[ar, idx]
    if padding_idx is not None:
        # the padding row's value is used but gets no gradient, as embedding's
        pad = F._wrap(((idx._data == (padding_idx % weight.shape[0]))[..., None]).astype(w._data.dtype))
        out = out * (1 - pad) + out.detach() * pad
    return ctx.wrap(ctx.unflat(out))


@batch_rule(primitives=("nll_loss",), public=("nll_loss",))
def _nll_loss(ctx, input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
              reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if is_batched(weight):
        return fallback(ctx, input, target, weight, None, ignore_index, None, reduction)
    single = ndim(input) == 1
    x = ctx.flat(input)                                   # [B, (N,) C]
    if single:
        x = x.unsqueeze(1)
    nbatch, n, c = x.shape
    if not isinstance(target, (Tensor, BatchedTensor)):
        target = F._wrap(np.asarray(target))
    t = ctx.phys(target, expand=True)._data
    t = t.reshape(nbatch, n).astype(np.int64)
    losses = ctx.fn(x.reshape(nbatch * n, c), F._wrap(t.reshape(-1)), weight, ignore_index=ignore_index,
                    reduction="none").reshape(nbatch, n)
    if reduction == "none":
        out = losses.squeeze(1) if single else losses
    elif reduction == "sum":
        out = losses.sum(1)
    else:
        valid = t != ignore_index
        w = valid.astype(x._data.dtype)
        if weight is not None:
            w = w * np.asarray(weight._data if isinstance(weight, Tensor) else weight)[np.where(valid, t, 0)]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = losses.sum(1) / F._wrap(w.sum(1).astype(x._data.dtype))
    return ctx.wrap(ctx.unflat(out))


@batch_rule(public=("cross_entropy",))
def _cross_entropy(ctx, *args, **kwargs):
    """log_softmax then nll_loss, each by its rule (the original, run on the BatchedTensors,
    calls them through the dispatched names); label smoothing loops over the batch."""
    target = args[1] if len(args) > 1 else kwargs.get("target")
    if kwargs.get("label_smoothing", args[7] if len(args) > 7 else 0.0) or (
            as_tensor_like(target) and target.is_floating_point()):      # smoothing, or class probabilities
        return fallback(ctx, *args, **kwargs)
    return ctx.fn(*args, **kwargs)


@batch_rule(public=("mse_loss",))
def _composite(ctx, *args, **kwargs):
    """A function written with Tensor methods and operators only runs on BatchedTensors as is."""
    return ctx.fn(*args, **kwargs)


@batch_rule(public=("binary_cross_entropy_with_logits",))
def _bce_with_logits(ctx, input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                     pos_weight=None):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        return ctx.fn(F.zeros_like(ctx.phys(input).reshape(tuple(input.shape))),
                      F.zeros_like(ctx.phys(target).reshape(tuple(target.shape))))   # torch's error
    rank = input.ndim
    losses = ctx.fn(ctx.phys(input, expand=True), ctx.phys(target, expand=True), ctx.padded(weight, rank),
                    reduction="none", pos_weight=ctx.padded(pos_weight, rank))
    dims = tuple(range(ctx.nb, ctx.nb + rank))
    if reduction == "none" or not dims:
        return ctx.wrap(losses)
    return ctx.wrap(losses.sum(dims) if reduction == "sum" else losses.mean(dims))


# --- autograd's own API on a BatchedTensor: torch's errors (grad / vjp do it inside vmap) -----------
@batch_rule(public=("backward",))
def _no_backward(ctx, *args, **kwargs):
    raise RuntimeError("backward() called inside a functorch transform. This is not supported, please use "
                       "functorch.grad or functorch.vjp instead or call backward() outside of functorch transforms.")


@batch_rule(public=("requires_grad_",))
def _no_requires_grad(ctx, *args, **kwargs):
    raise RuntimeError("You are attempting to call Tensor.requires_grad_() (or perhaps using "
                       "torch.autograd.functional.* APIs) inside of a function being transformed by a functorch "
                       "transform. This is unsupported, please attempt to use the functorch transforms (e.g. grad, "
                       "vjp, jacrev, jacfwd, hessian) or call requires_grad_() outside of a function being "
                       "transformed instead.")


# --- forward-mode AD: dual tensors are physical -------------------------------------------------
@batch_rule(public=("make_dual",))
def _make_dual(ctx, tensor, tangent, *, level=None):
    """The dual of the physical tensors (both expanded over the union of their levels): every
    op then carries each sample's tangent in its rows, as it does the primal's."""
    if tuple(tensor.shape) != tuple(tangent.shape):
        ctx.fn(F.zeros_like(ctx.phys(tensor).reshape(tuple(tensor.shape))),
               F.zeros_like(ctx.phys(tangent).reshape(tuple(tangent.shape))), level=level)  # torch's error
    return ctx.wrap(ctx.fn(ctx.phys(tensor, expand=True), ctx.phys(tangent, expand=True), level=level))


@batch_rule(public=("unpack_dual",))
def _unpack_dual(ctx, tensor, *, level=None):
    unpacked = ctx.fn(physical(tensor), level=level)
    return unpacked._replace(primal=ctx.wrap(unpacked.primal),
                             tangent=None if unpacked.tangent is None else ctx.wrap(unpacked.tangent))


# --- random ops: vmap's randomness flag -------------------------------------------------------------
# ops that draw from a generator: each goes through _random_call (the rule of rand, randn,
# rand_like, randn_like and dropout draws the batch at once instead)
RANDOM_OPS = {"bernoulli", "bernoulli_", "multinomial", "normal", "normal_", "uniform_", "random_", "exponential_",
              "randint", "randint_like", "randperm", "poisson", "cauchy_", "geometric_", "log_normal_"}
RANDOM_ERROR = ("vmap: called random operation while in randomness error mode. Please either use the 'same' or "
                "'different' randomness flags on vmap or perform the randomness operation out of vmap")


def random_levels():
    """The active levels a random op gives different values over; raises in 'error' mode."""
    if any(lvl.randomness == "error" for lvl in LEVELS):
        raise RuntimeError(RANDOM_ERROR)
    return tuple(lvl.id for lvl in LEVELS if lvl.randomness == "different")


def random_factory(fn, name=None):
    """rand / randn under vmap: one draw per sample of the 'different' levels."""
    def make(*size, **kwargs):
        levels = random_levels()
        if not levels:
            return fn(*size, **kwargs)
        sizes = tuple(level_size(lvl) for lvl in levels)
        return BatchedTensor(fn(sizes + _shape(size), **kwargs), levels)
    return make


def random_like(fn, name=None):
    """rand_like / randn_like under vmap."""
    def make_like(t, *args, **kwargs):
        levels = random_levels()
        own = t._levels if is_batched(t) else ()
        every = tuple(sorted(set(levels) | set(own)))
        if not every:
            return fn(t, *args, **kwargs)
        sizes = tuple(level_size(lvl) if lvl in levels else 1 for lvl in every)
        draw = fn(zeros(sizes + tuple(t.shape)), *args, **({"dtype": t.dtype} | kwargs))
        return BatchedTensor(draw.expand(tuple(level_size(lvl) for lvl in every) + tuple(t.shape)), every)
    return make_like


def random_dropout(fn, name=None):
    """dropout under vmap: the mask is drawn per sample of the 'different' levels."""
    def dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return input
        levels = random_levels()
        own = input._levels if is_batched(input) else ()
        every = tuple(sorted(set(levels) | set(own)))
        if not every:
            return fn(input, p, training, inplace)
        sizes = tuple(level_size(lvl) if lvl in levels else 1 for lvl in every)
        ones = F._wrap(np.ones(sizes + tuple(input.shape), dtype=input.dtype.np if hasattr(input.dtype, "np")
                               else np.float64))
        return input * BatchedTensor(fn(ones, p, True, False), every)
    return dropout
