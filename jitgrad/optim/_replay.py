"""An optimizer's step as jitgrad.compile's replay runs it: one compiled call per group.

step() spends a few microseconds of Python per parameter (checks, state lookups,
addresses, scalars). In a replayed training step the same parameters get their
gradients at the same addresses every call (the plan's buffer, compiler/plan.py), and
their state arrays exist since the recorded step made them. So all of that is looked
up once, here, into the pointer table the kernels of kernels/optim.py take; a call then
only checks that this still holds (the same arrays, no other parameter with a gradient)
and refreshes the scalars from the groups (a scheduler may change lr between calls).

`make(opt, grads)` returns a FastStep, or None when this optimizer has no such form
(numpy updates, maximize, an array the kernel cannot take).
"""
import math
import operator

import numpy as np

from jitgrad.graph.tape import _address
from jitgrad.optim import _kernels

SGD_KIND, ADAM_KIND = 1, 2   # what the fused replay (engine/replayer.train_step) runs


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


class FastStep:
    """What opt.step() does, for a step whose gradients are the plan's buffer views."""

    def __init__(self, opt, kind, groups):
        self.opt, self.kind, self.groups = opt, kind, groups
        # the optimizer's groups and their parameters when the table was made: a group added
        # (add_param_group) or a group's parameters changed (param_groups[0]["params"] = [...],
        # .append(p)) must make step() run, as eager's would, over the groups as they are now
        self.layout = [(grp, tuple(grp["params"])) for grp in opt.param_groups]

    def ready(self, grads_set):
        """The optimizer's groups and their parameters are those of the table, every parameter
        still has the arrays of the table, and its .grad is the plan's view (grads_set) or
        still None (the fused replay sets it after its one call)."""
        groups = self.opt.param_groups
        if len(groups) != len(self.layout):
            return False
        for grp, (grp0, params) in zip(groups, self.layout):
            ps = grp["params"]
            if grp is not grp0 or len(ps) != len(params) or not all(map(operator.is_, ps, params)):
                return False
        state_of = self.opt.state
        for g in self.groups:
            # not maximizing (make() has no form for it), with the state arrays the table
            # has (SGD: a momentum buffer iff momentum)
            if g.group["maximize"]:
                return False
            if self.kind == SGD_KIND and bool(g.group["momentum"]) != bool(g.keys):
                return False
            keys = g.keys
            for p, view, arrays in zip(g.params, g.views, g.arrays):
                gr = p._grad
                if (gr is None or gr._data is not view) if grads_set else gr is not None:
                    return False
                if p._data is not arrays[0]:
                    return False
                if keys:
                    state = state_of.get(p)
                    if state is None:
                        return False
                    for k, a in zip(keys, arrays[1:]):
                        s = state.get(k)
                        if (s._data if s is not None else p._data) is not a:
                            return False
        if self.kind == ADAM_KIND:
            for g in self.groups:
                if g.group["amsgrad"] and any("max_exp_avg_sq" not in state_of[p] for p in g.params):
                    return False
        return True

    def scalars(self, g):
        """The group's per-parameter scalars for this step (Adam: counts the step)."""
        grp = g.group
        if self.kind == SGD_KIND:
            key = (grp["lr"], grp["weight_decay"], grp["momentum"], grp["dampening"], grp["nesterov"])
            if key != g.key:
                lr, wd, mom, damp, _ = key
                g.sc = np.array([[lr, wd, mom, 1 - damp, 0.0]] * len(g.params), g.like.dtype)
                g.key = key
            return g.sc
        lr, (b1, b2), eps, wd = grp["lr"], grp["betas"], grp["eps"], grp["weight_decay"]
        rows = []
        state_of = self.opt.state
        for p in g.params:
            state = state_of[p]
            state["step"] += 1
            step = state["step"]
            rows.append((1 - b1, b2, 1 - b2, eps, wd, lr / (1 - b1 ** step), math.sqrt(1 - b2 ** step), 1 - lr * wd))
        return np.array(rows, g.like.dtype)

    def flags(self, g):
        grp = g.group
        if self.kind == SGD_KIND:
            return bool(grp["momentum"]), bool(grp["nesterov"])
        return bool(self.opt._decoupled), bool(grp["amsgrad"])

    def bump(self):
        for g in self.groups:
            for p in g.params:
                p._bump()

    def __call__(self):
        """Run the step (True), or change nothing and return False (call step() instead)."""
        if not self.ready(True):
            return False
        for g in self.groups:
            sc = self.scalars(g)
            f1, f2 = self.flags(g)
            if self.kind == SGD_KIND:
                _kernels._sgd_all(g.ptrs, g.sizes, sc, g.like, f1, f2)
            else:
                _kernels._adam_all(g.ptrs, g.sizes, sc, g.like, f1, f2)
        self.bump()
        return True


def make(opt, grads):
    """(see the module doc) grads: id(parameter) -> the array its .grad is at each replay."""
    if not _kernels.available():
        return None
    name = type(opt).__name__
    if name == "SGD":
        kind, keys = SGD_KIND, ("momentum_buffer",)
    elif name in ("Adam", "AdamW"):
        kind, keys = ADAM_KIND, ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    else:
        return None
    groups = []
    for group in opt.param_groups:
        if group["maximize"]:
            return None
        if kind == SGD_KIND and not group["momentum"]:
            g = _group(opt, group, grads, ())
            if g is not None:  # the kernel reads a third pointer: the parameter stands in
                g.ptrs = np.concatenate([g.ptrs, g.ptrs[:, :1]], axis=1)
                g.arrays = [a + [a[0]] for a in g.arrays]
        else:
            g = _group(opt, group, grads, keys)
        if g is None:
            if any(id(p) in grads for p in group["params"]):
                return None
            continue
        groups.append(g)
    return FastStep(opt, kind, groups) if groups else None
