"""An optimizer's step as jitgrad.compile's replay runs it: one compiled call per group.

step() spends a few microseconds of Python per parameter (checks, state lookups,
addresses, scalars). In a replayed training step the same parameters get their
gradients at the same addresses every call (the plan's buffer, compiler/plan.py), and
their state arrays exist since the recorded step made them. So all of that is looked
up once, here, into the pointer table the kernel of optim/_kernels.py takes; a call
then only checks that this still holds (the same arrays, the gradients on the plan's
buffer, no other parameter with a gradient) and refreshes the scalars from the groups
(a scheduler may change lr between calls).

`make(opt, grads)` returns a function that does what opt.step() would and returns True,
or changes nothing and returns False when the checks fail (the caller then calls
step()); or None when this optimizer has no such form (numpy updates, maximize, an
array the kernel cannot take).
"""
import math

import numpy as np

from jitgrad.graph.tape import _address
from jitgrad.optim import _kernels


class _Group:
    __slots__ = ("group", "keys", "params", "views", "arrays", "ptrs", "sizes", "sc", "like", "key")


def _group(opt, group, grads, state_keys):
    """The group's table, or None. state_keys: the state arrays the kernel reads per
    parameter, in its order (a missing optional one reads the parameter itself)."""
    g = _Group()
    g.group = group
    g.keys = state_keys
    g.params, g.views, g.arrays, ptrs = [], [], [], []
    dtype = None
    for p in group["params"]:
        view = grads.get(id(p))
        if view is None:
            if p._grad is not None:
                return None  # a gradient from elsewhere: step() decides
            continue
        d = p._data
        state = opt.state.get(p, {})
        arrays = [d] + [state[k]._data if k in state else d for k in state_keys]
        if any(k not in state for k in state_keys[:1]) or not _kernels._fits(d, arrays + [view]):
            return None
        dtype = dtype or d.dtype
        if d.dtype != dtype:
            return None
        g.params.append(p)
        g.views.append(view)
        g.arrays.append(arrays)
        ptrs.append([_address(d), _address(view)] + [_address(a) for a in arrays[1:]])
    if not g.params:
        return None
    g.ptrs = np.array(ptrs, np.int64)
    g.sizes = np.array([p._data.size for p in g.params], np.int64)
    g.like = np.zeros(0, dtype)
    g.key = None
    return g


def _holds(opt, groups):
    """Every parameter still has the arrays of the table and its gradient on the plan's buffer."""
    for g in groups:
        state_keys = g.keys
        for p, view, arrays in zip(g.params, g.views, g.arrays):
            gr = p._grad
            if gr is None or gr._data is not view or p._data is not arrays[0]:
                return False
            if not state_keys:
                continue
            state = opt.state.get(p)
            if state is None:
                return False
            for k, a in zip(state_keys, arrays[1:]):
                s = state.get(k)
                if (s._data if s is not None else p._data) is not a:
                    return False
    return True


def make(opt, grads):
    """(see the module doc) grads: id(parameter) -> the array its .grad is at each replay."""
    if not _kernels.available():
        return None
    kind = type(opt).__name__
    if kind == "SGD":
        keys = ("momentum_buffer",)
    elif kind in ("Adam", "AdamW"):
        keys = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    else:
        return None
    groups = []
    for group in opt.param_groups:
        if group["maximize"]:
            return None
        if kind == "SGD" and not group["momentum"]:
            g = _group(opt, group, grads, ())
            if g is not None:  # the kernel reads a third pointer: the parameter stands in
                g.ptrs = np.concatenate([g.ptrs, g.ptrs[:, :1]], axis=1)
                g.arrays = [a + [a[0]] for a in g.arrays]
        else:
            g = _group(opt, group, grads, keys[:1] if kind == "SGD" else keys)
        if g is None:
            if any(id(p) in grads for p in group["params"]):
                return None
            continue
        groups.append(g)
    if not groups:
        return None
    if kind == "SGD":
        def run():
            if not _holds(opt, groups):
                return False
            for g in groups:
                grp = g.group
                key = (grp["lr"], grp["weight_decay"], grp["momentum"], grp["dampening"], grp["nesterov"])
                if key != g.key:
                    lr, wd, mom, damp, _ = key
                    g.sc = np.array([[lr, wd, mom, 1 - damp, 0.0]] * len(g.params), g.like.dtype)
                    g.key = key
                _kernels._sgd_all(g.ptrs, g.sizes, g.sc, g.like, bool(grp["momentum"]), grp["nesterov"])
                for p in g.params:
                    p._bump()
            return True
        return run

    def run_adam():
        if not _holds(opt, groups):
            return False
        for g in groups:
            grp = g.group
            if grp["amsgrad"] and any("max_exp_avg_sq" not in opt.state[p] for p in g.params):
                return False
        for g in groups:
            grp = g.group
            lr, (b1, b2), eps, wd = grp["lr"], grp["betas"], grp["eps"], grp["weight_decay"]
            rows = []
            for p in g.params:
                state = opt.state[p]
                state["step"] += 1
                step = state["step"]
                rows.append((1 - b1, b2, 1 - b2, eps, wd, lr / (1 - b1 ** step), math.sqrt(1 - b2 ** step),
                             1 - lr * wd))
            _kernels._adam_all(g.ptrs, g.sizes, np.array(rows, g.like.dtype), g.like, opt._decoupled,
                               grp["amsgrad"])
            for p in g.params:
                p._bump()
        return True
    return run_adam
