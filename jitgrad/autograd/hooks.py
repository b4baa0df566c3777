"""Hooks: Python the user asked to run during backward.

Hooks on non-leaf tensors and on nodes live in their tape, keyed by row (node objects
are made on demand and come and go): a tensor's hooks by its own row, a node's pre-hooks
and post-hooks by the node's row. The compiled sweep stops at such rows (PRE: status 4,
the hooks see and may replace the complete gradient, then the row runs; a node with
post-hooks runs in Python, status 3, so its input gradients exist separately). Hooks on
leaves run where the leaf's gradient is accumulated.
"""
import itertools

from .._tensor import Tensor

_ids = itertools.count()
# how many hooks on leaves (tensor, post-accumulate, AccumulateGrad) exist: while none do,
# backward skips every per-leaf hook check
leaf_hooks = [0]


class RemovableHandle:
    """Returned by register_*hook; `remove()` unregisters the hook."""

    def __init__(self, registry, key, on_leaf=False):
        self._registry = registry
        self._key = key
        self._on_leaf = on_leaf
        self.id = key[1]

    def remove(self):
        hooks = self._registry.get(self._key[0])
        if hooks is not None and self.id in hooks:
            del hooks[self.id]
            if self._on_leaf:
                leaf_hooks[0] -= 1
            if not hooks:
                del self._registry[self._key[0]]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def add_hook(registry, where, fn, on_leaf=False):
    """registry: a dict where -> {hook id: fn} (dicts keep registration order)."""
    hid = next(_ids)
    registry.setdefault(where, {})[hid] = fn
    if on_leaf:
        leaf_hooks[0] += 1
    return RemovableHandle(registry, (where, hid), on_leaf)


_TYPE_NAMES = {"float64": "torch.DoubleTensor", "float32": "torch.FloatTensor", "int64": "torch.LongTensor",
               "int32": "torch.IntTensor", "bool": "torch.BoolTensor"}


def run_tensor_hooks(hooks, grad):
    """Each hook sees the previous one's result; a returned tensor replaces the gradient.
    A hook on an output that got no gradient (a multi-output node's) receives None."""
    for fn in list(hooks.values()):
        r = fn(grad)
        if r is not None:
            if not isinstance(r, Tensor):
                raise TypeError(f"expected a Tensor or None from a hook, got {type(r).__name__}")
            _check_value(fn, grad, r)
            grad = r
    return grad


def _check_value(fn, old, new):
    """A hook may replace a gradient only by one of the same dtype and shape (the engine
    writes it into the old one's buffer)."""
    if old is None or new is None:
        return
    name = getattr(fn, "__name__", "hook")
    if not isinstance(new, Tensor):
        raise TypeError(f"expected a Tensor or None from a hook, got {type(new).__name__}")
    if new._data.dtype != old._data.dtype:
        raise RuntimeError(f"hook '{name}' has changed the type of value (was "
                           f"{_type_name(old)} got {_type_name(new)})")
    if tuple(new._data.shape) != tuple(old._data.shape):
        raise RuntimeError(f"hook '{name}' has changed the size of value")


def _type_name(t):
    return _TYPE_NAMES.get(t._data.dtype.name, f"torch.{t._data.dtype.name}")


def _replacement(fn, r, old):
    new = list(r if isinstance(r, (tuple, list)) else (r,))
    if len(new) != len(old):
        raise RuntimeError(f"hook '{getattr(fn, '__name__', 'hook')}' has returned an incorrect number of values "
                           f"(got {len(new)}, but expected {len(old)})")
    return new


def run_node_prehooks(hooks, grads):
    for fn in list(hooks.values()):
        r = fn(tuple(grads))
        if r is not None:
            new = _replacement(fn, r, grads)
            for a, b in zip(grads, new):
                _check_value(fn, a, b)
            grads = new
    return grads


def run_node_posthooks(hooks, grad_inputs, grad_outputs):
    for fn in list(hooks.values()):
        r = fn(tuple(grad_inputs), tuple(grad_outputs))
        if r is not None:
            new = _replacement(fn, r, grad_inputs)
            for a, b in zip(grad_inputs, new):
                if a is None and b is not None:
                    raise RuntimeError("can't replace a None gradient with a non-None value")
                _check_value(fn, a, b)
            grad_inputs = new
    return grad_inputs


class _MultiHandle:
    def __init__(self, handles):
        self.handles = handles

    def remove(self):
        for h in self.handles:
            h.remove()


def register_multi_grad_hook(tensors, fn, *, mode="all"):
    """mode "all": fn(grads) once per backward call, after the gradients of the given
    tensors are computed (None for those the call does not reach); mode "any": fn(grad)
    with the first of them computed in each call."""
    from . import _engine
    if mode not in ("all", "any"):
        raise ValueError(f"Expects mode to be one of ('all', 'any') but got {mode}")
    tensors = tuple(tensors)
    state = {"call": None, "grads": None}

    def make(i):
        def hook(grad):
            call = _engine.current_call()
            if mode == "any":
                if state["call"] != call:
                    state["call"] = call
                    fn(grad)
                return None
            if state["call"] != call:
                state["call"] = call
                grads = state["grads"] = [None] * len(tensors)
                _engine.queue_callback(lambda: fn(grads))
            state["grads"][i] = grad
            return None
        return hook

    return _MultiHandle([t.register_hook(make(i)) for i, t in enumerate(tensors) if t.requires_grad])
