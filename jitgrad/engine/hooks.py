"""Running hooks during backward: each hook sees the previous one's result, and what it
returns is checked the way PyTorch checks it (graph/hooks.py keeps the registries)."""
from jitgrad._core.messages import tensor_type
from jitgrad.graph.tensor import Tensor


def run_tensor_hooks(hooks, grad):
    """Each hook sees the previous one's result; a returned tensor replaces the gradient.
    A hook on an output that got no gradient (a multi-output node's) receives None."""
    for fn in list(hooks.values()):
        r = fn(grad)
        if r is not None:
            if not isinstance(r, Tensor):
                raise TypeError(f"expected Variable, but hook returned '{type(r).__name__}'")
            _check_value(fn, grad, r)
            grad = r
    return grad


def version_of(g):
    """g's version before hooks see it (None for no gradient)."""
    return None if g is None else g._version


def written(old, new, version):
    """Whether hooks changed a gradient the engine handed them as a copy of its buffer: they
    returned another tensor, or wrote the one they got in place (returning it or None),
    which torch's hooks see in the engine's own buffer."""
    if new is not None and new is not old:
        return True
    return old is not None and old._version != version


def _check_value(fn, old, new):
    """A hook may replace a gradient only by one of the same dtype and shape (the engine
    writes it into the old one's buffer)."""
    if old is None or new is None:
        return
    name = getattr(fn, "__name__", "hook")
    if not isinstance(new, Tensor):
        raise TypeError(f"expected Variable, but hook returned '{type(new).__name__}'")
    if new._data.dtype != old._data.dtype:
        raise RuntimeError(f"hook '{name}' has changed the type of value (was "
                           f"{_type_name(old)} got {_type_name(new)})")
    if tuple(new._data.shape) != tuple(old._data.shape):
        raise RuntimeError(f"hook '{name}' has changed the size of value")


def _type_name(t):
    return tensor_type(t._data.dtype)


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
