"""BatchedTensor: what a function under vmap sees in place of a Tensor.

A BatchedTensor holds one physical jitgrad Tensor whose leading dims are the batch dims of
the vmap levels it is batched over, in level order (outermost first), and those levels.
Its logical shape, the one user code sees, is the physical shape without them. It is not
a Tensor subclass: ops read `._data` directly, so a BatchedTensor must never reach them;
while a level is active the public entry points are dispatchers (_dispatch.py) that hand
calls with BatchedTensor arguments to the op's batching rule (_rules.py), which computes
on the physical tensors with ordinary jitgrad ops, so autograd records through it.

Levels are ints that grow with each vmap call; the stack of active ones (`LEVELS`) knows
each level's batch size and randomness mode.
"""
import itertools

import numpy as np

from jitgrad._core.forward import state as _fw_state
from jitgrad.autograd import forward_ad
from jitgrad.engine.run import grad as _autograd_grad
from jitgrad.graph.tensor import Size, Tensor, _wrap_dim, ones_like


class Level:
    __slots__ = ("id", "size", "randomness")

    def __init__(self, id, size, randomness):
        self.id, self.size, self.randomness = id, size, randomness


LEVELS = []              # the active vmap levels, outermost first
_next_id = itertools.count(1)


def push_level(size, randomness):
    lvl = Level(next(_next_id), size, randomness)
    LEVELS.append(lvl)
    return lvl


def pop_level(lvl):
    assert LEVELS and LEVELS[-1] is lvl, "vmap levels must exit in the order they entered"
    LEVELS.pop()


def active_levels():
    """The ids of the active vmap levels, outermost first (empty outside vmap)."""
    return tuple(lvl.id for lvl in LEVELS)


def level_size(level_id):
    for lvl in LEVELS:
        if lvl.id == level_id:
            return lvl.size
    raise RuntimeError("vmap: a BatchedTensor escaped the vmap that made it; return it from the "
                       "vmapped function instead of keeping it")


def _data_dependent(what):
    raise RuntimeError(f"vmap: It looks like you're {what}. We don't support that yet, please file an issue "
                       "at https://github.com/pytorch/pytorch/issues .")


class BatchedTensor:
    """A logical tensor under vmap: `_phys` (a Tensor) batched over `_levels` (its first
    len(_levels) dims). Methods and operators are the table's, added by _dispatch.py."""
    __slots__ = ("_phys", "_levels")

    def __init__(self, phys, levels):
        self._phys = phys
        self._levels = tuple(levels)

    # -- logical metadata -------------------------------------------------------------
    @property
    def shape(self):
        return Size(self._phys._data.shape[len(self._levels):])

    def size(self, dim=None):
        shape = self.shape
        return shape if dim is None else shape[_wrap_dim(dim, len(shape))]

    @property
    def ndim(self):
        return self._phys._data.ndim - len(self._levels)

    def dim(self):
        return self.ndim

    def ndimension(self):
        return self.ndim

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    nelement = numel

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    @property
    def dtype(self):
        return self._phys.dtype

    @property
    def device(self):
        return self._phys.device

    def is_floating_point(self):
        return self._phys.is_floating_point()

    def is_complex(self):
        return False

    def is_contiguous(self):
        return True

    @property
    def requires_grad(self):
        return self._phys.requires_grad

    @requires_grad.setter
    def requires_grad(self, value):
        self._phys.requires_grad = value

    @property
    def is_leaf(self):
        return self._phys.is_leaf

    @property
    def grad_fn(self):
        return self._phys.grad_fn

    @property
    def grad(self):
        g = self._phys.grad
        return None if g is None else BatchedTensor(g, self._levels)

    @property
    def data(self):
        return BatchedTensor(self._phys.data, self._levels)

    def __repr__(self):
        return f"BatchedTensor(lvls={list(self._levels)}, value=\n{self._phys!r}\n)"

    __str__ = __repr__

    def __hash__(self):
        return id(self)

    # -- values a function could branch on: torch's errors --------------------------------
    def item(self):
        raise RuntimeError("vmap: It looks like you're calling .item() on a Tensor. We don't support vmap over "
                           "calling .item() on a Tensor, please try to rewrite what you're doing with other "
                           "operations. If error is occurring somewhere inside PyTorch internals, please file a "
                           "bug report.")

    __float__ = __int__ = item

    def __bool__(self):
        _data_dependent("attempting to use a Tensor in some data-dependent control flow")

    __index__ = __bool__

    def tolist(self):
        _data_dependent("calling .tolist() on a Tensor")

    def numpy(self):
        _data_dependent("calling .numpy() on a Tensor")


def is_batched(x):
    return type(x) is BatchedTensor


def physical(x):
    """The physical Tensor of a BatchedTensor (x itself otherwise)."""
    return x._phys if type(x) is BatchedTensor else x


def wrap(phys, levels):
    """phys (leading dims: the batch dims of `levels`) as a logical tensor; no levels: phys."""
    return BatchedTensor(phys, levels) if levels else phys


def align(x, levels, expand=False):
    """x's physical tensor with one leading dim per level of `levels` (a superset of x's,
    in order): size 1 where x is not batched over the level, or the level's size with
    expand=True. A plain Tensor counts as batched over no level."""
    own = x._levels if type(x) is BatchedTensor else ()
    p = physical(x)
    if own == tuple(levels):
        return p
    for i, lvl in enumerate(levels):
        if lvl not in own:
            p = p.unsqueeze(i)
    if expand:
        p = p.expand(tuple(level_size(lvl) for lvl in levels) + tuple(p.shape[len(levels):]))
    return p


def batched_leaf_like(x):
    """A fresh tensor with x's logical value per sample, physically batched over every active
    level (x expanded and copied, so that each sample's gradient has its own rows), to be
    differentiated: grad() inside vmap makes its inputs this way, and one backward of the
    batched output's physical values then gives each sample's gradient in the rows of the
    physical tensor (batching rules never mix samples). It is a leaf (requires_grad=True)
    when x does not require grad, else a differentiable copy of x."""
    levels = active_levels()
    p = align(x, levels, expand=True)
    if p.requires_grad or _has_tangent(p):
        # differentiable in both modes: an enclosing transform (jvp, jacfwd, grad) sees through it
        p = p.clone()
        if not p.requires_grad:
            p.requires_grad_(True)
    else:
        # a C-order copy: numpy's copy of an expanded array keeps the stride-0 batch dim
        # innermost, and every op and saved value would then pay for that layout
        p = transform_leaf(Tensor._make(np.array(p._data, order="C")).requires_grad_(True))
    return wrap(p, levels)


def transform_leaf(t):
    """t marked as a leaf a transform made for one of its inputs (transforms._reaches_foreign_leaf)."""
    t._func_leaf = True
    return t


def _has_tangent(p):
    return _fw_state.level >= 0 and forward_ad.unpack_dual(p).tangent is not None


def as_tensor_like(x):
    """True for the values a rule treats as tensors (Tensor or BatchedTensor)."""
    return type(x) is BatchedTensor or isinstance(x, Tensor)


def grad_per_sample(outputs, inputs, grad_outputs=None, **kwargs):
    """autograd.grad inside vmap: the gradients of logical `outputs` with respect to logical
    `inputs` made by batched_leaf_like, per sample (BatchedTensors over the inputs' levels).
    One backward of the physical outputs does it: sample b's output depends only on sample
    b's rows of each physical input. grad_outputs: logical, or None for ones (outputs with
    one element per sample, as grad()'s)."""
    outs = [physical(o) for o in outputs]
    if grad_outputs is None:
        gos = [ones_like(o) for o in outs]
    else:
        gos = [align(g, o._levels if is_batched(o) else (), expand=True) if g is not None else ones_like(o)
               for g, o in zip(grad_outputs, outputs)]
    grads = _autograd_grad(outs, [physical(x) for x in inputs], gos, **kwargs)
    return tuple(None if g is None else wrap(g, x._levels if is_batched(x) else ()) for g, x in zip(grads, inputs))
