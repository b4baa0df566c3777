"""Compiled optimizer updates: one pass over a parameter's elements, no temporaries.

The numpy form of Adam makes about ten full-size temporaries per parameter; this loop
reads each element of param, grad, exp_avg and exp_avg_sq once and writes three of
them. The arithmetic is in the same order as torch's single-tensor Adam, with every
scalar computed in Python floats (1 - beta1, 1 - lr * wd, ...) and only then cast to the
parameter's dtype (`sc` is an array of that dtype), as numpy and torch do for float32:
computing 1 - beta1 in float32 would give a different rounding.

A step is one compiled call over all of a group's parameters (per dtype): Python collects
each parameter's arrays as addresses (`Batch`), and the kernel reads them in place
through pointers, as the backward scheduler reads saved values (kernels/pointers.py).
"""
import numba
import numpy as np

from jitgrad.graph.tape import _address
from jitgrad.kernels.optim import adam_all as _adam_all  # the loops: kernels/optim.py
from jitgrad.kernels.optim import rmsprop_all as _rmsprop_all
from jitgrad.kernels.optim import sgd_all as _sgd_all


def available():
    """The NUMBA_DISABLE_JIT test pass takes numpy (the loop would run in Python), so that
    both forms are checked against torch in CI."""
    return not numba.config.DISABLE_JIT


class Batch:
    """The parameters of one step that the kernel takes, by dtype: their arrays' addresses
    and each one's scalars. The arrays are held until the call, so the addresses stay
    valid. A parameter's own and state arrays live across steps, so their addresses are
    kept in `cache` (the optimizer's) and reused while the same arrays are there; only the
    gradient, new each step, is looked up every time.

    The kernel reads and writes d.size elements of d's dtype at every address it is given,
    unchecked. So an entry enters the cache only when each of its arrays is one the kernel
    may do that to (`_fits`), and is rebuilt when any of them is replaced (p.data assigned,
    a state dict loaded); the gradient is made to fit on every call."""

    def __init__(self, cache):
        self.cache = cache
        self.by_dtype = {}

    def add(self, key, d, g, state, scalars):
        """Take the parameter into the call, or return False (numpy runs it) when its arrays
        are not all C-contiguous, writable and of d's shape and dtype."""
        fixed = (d,) + state
        hit = self.cache.get(key)
        # the same arrays (the entry holds them, so equal ids are the same objects)
        if hit is None or list(map(id, hit[0])) != list(map(id, fixed)):
            self.cache.pop(key, None)  # what the old entry holds is no longer the parameter's
            if not _fits(d, fixed):
                return False
            hit = self.cache[key] = (fixed, [_address(a) for a in fixed])
        if not (type(g) is np.ndarray and g.shape == d.shape and g.dtype == d.dtype and g.flags.c_contiguous):
            g = _grad_for(d, g)
        held, ptrs, sizes, sc = self.by_dtype.setdefault(d.dtype, ([], [], [], []))
        held.append(g)
        addrs = hit[1]
        ptrs.append([addrs[0], _address(g)] + addrs[1:])
        sizes.append(d.size)
        sc.append(scalars)
        return True

    def groups(self):
        for dtype, (held, ptrs, sizes, sc) in self.by_dtype.items():
            yield (np.array(ptrs, np.int64), np.array(sizes, np.int64), np.array(sc, dtype), np.zeros(0, dtype))


def _fits(d, arrays):
    """Every array is a plain ndarray the kernel can read and write as d.size elements of
    d's dtype. Checked once per array, when its address is cached."""
    return all(type(a) is np.ndarray and a.shape == d.shape and a.dtype == d.dtype and a.flags.c_contiguous
               and a.flags.writeable for a in arrays)


def _grad_for(d, g):
    """The gradient as the kernel reads it: d's shape (a broadcastable one is expanded, as
    torch's in-place ops do), d's dtype, contiguous. The optimizers have raised torch's error
    for a gradient that does not broadcast; this is the guard that no read goes past it."""
    if g.shape != d.shape:
        try:
            g = np.broadcast_to(g, d.shape)
        except ValueError:
            raise RuntimeError(f"The size of the gradient {list(g.shape)} does not match the parameter's "
                               f"{list(d.shape)}") from None
    if type(g) is not np.ndarray or g.dtype != d.dtype or not g.flags.c_contiguous:
        g = np.ascontiguousarray(g, dtype=d.dtype)
    return g


def adam_add(batch, p, d, g, m, v, vmax, lr, b1, b2, eps, wd, step_size, bc2_sqrt):
    return batch.add(p, d, g, (m, v, vmax if vmax is not None else m),
              (1 - b1, b2, 1 - b2, eps, wd, step_size, bc2_sqrt, 1 - lr * wd))


def adam_run(batch, decoupled, amsgrad):
    for ptrs, sizes, sc, like in batch.groups():
        _adam_all(ptrs, sizes, sc, like, decoupled, amsgrad)


def sgd_add(batch, p, d, g, buf, lr, wd, mom, damp, first):
    return batch.add(p, d, g, (buf if buf is not None else d,), (lr, wd, mom, 1 - damp, float(first)))


def sgd_run(batch, momentum, nesterov):
    for ptrs, sizes, sc, like in batch.groups():
        _sgd_all(ptrs, sizes, sc, like, momentum, nesterov)


def rmsprop_add(batch, p, d, g, sq, gavg, buf, scalars):
    return batch.add(p, d, g, (sq, sq if gavg is None else gavg, sq if buf is None else buf), scalars)


def rmsprop_run(batch, centered, momentum):
    for ptrs, sizes, sc, like in batch.groups():
        _rmsprop_all(ptrs, sizes, sc, like, centered, momentum)
