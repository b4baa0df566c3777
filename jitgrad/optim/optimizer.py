"""Optimizer base: parameter groups, per-parameter state, zero_grad, state dicts."""
import copy
import warnings

import numpy as np

from jitgrad._core import modes as _grad_mode
from jitgrad._core.capture import state as _cap
from jitgrad._core.messages import typename
from jitgrad.graph.tensor import Tensor
from jitgrad.optim import _device


class _RequiredParameter:
    def __repr__(self):
        return "<required parameter>"


required = _RequiredParameter()


class Optimizer:
    def __init__(self, params, defaults):
        self.defaults = defaults
        self.state = {}
        self.param_groups = []
        self._addresses = {}  # the compiled step's cache of array addresses (optim/_kernels.Batch)
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            f"but got {typename(params)}")
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(params[0], dict):
            params = [{"params": params}]
        for group in params:
            self.add_param_group(group)

    def add_param_group(self, group):
        group = _group_with_checked_params(group, self.defaults)
        for k, v in self.defaults.items():
            if v is required and k not in group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {k}")
            group.setdefault(k, v)
        _check_params_unique(group, self.param_groups)
        self.param_groups.append(group)

    def zero_grad(self, set_to_none=True):
        if _cap.on and _cap.mine():  # jitgrad.compile is recording: replayed as this same call
            return _cap.rec.call(Optimizer.zero_grad, self, set_to_none)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        _data(p.grad)[...] = 0

    def _params_with_grad(self, group):
        return [p for p in group["params"] if p.grad is not None]

    def step(self, closure=None):
        if _cap.on and _cap.mine():  # jitgrad.compile is recording: replayed as this same call
            if closure is not None:
                _cap.rec.stop("optimizer.step(closure)")
            else:
                return _cap.rec.call(Optimizer.step, self)
        loss = None
        if closure is not None:
            with _grad_mode.enable_grad():
                loss = closure()
        with _grad_mode.no_grad():
            # every parameter of every group is checked before any is updated: a step that
            # raises (torch's error for a state or gradient that does not fit) changes nothing
            todo = [self._check(group) for group in self.param_groups]
            for group, params in zip(self.param_groups, todo):
                self._update(group, params)
        return loss

    def _check(self, group):
        """The group's parameters that this step updates; raises torch's error (optim/_checks)
        for one whose gradient or state does not fit it."""
        raise NotImplementedError

    def _update(self, group, params):
        raise NotImplementedError

    def state_dict(self):
        index = {}
        groups = []
        for group in self.param_groups:
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                g["params"].append(index[id(p)])
            groups.append(g)
        state = {index[id(p)]: {k: _copy_value(v) for k, v in s.items()}
                 for p, s in ((p, self.state[p]) for g in self.param_groups for p in g["params"] if p in self.state)}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """As torch: the groups must match in number and size; floating state is cast to its
        parameter's dtype (but 'step'). State whose shape differs from its parameter's is
        loaded, as in torch, and the next step raises torch's error for it."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(mine["params"]) != len(theirs["params"]) for mine, theirs in zip(self.param_groups, groups)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                             "optimizer's group")
        by_index = {i: p for mine, theirs in zip(self.param_groups, groups)
                    for p, i in zip(mine["params"], theirs["params"])}
        state = {}
        for i, s in state_dict["state"].items():
            p = by_index.get(i)
            # torch keeps the state of an index no group names under that index
            state[i if p is None else p] = {k: _load_value(v, p, k) for k, v in s.items()}
        # nothing above changed the optimizer: a state dict that raises leaves it as it was
        for mine, theirs in zip(self.param_groups, groups):
            mine.update({k: v for k, v in theirs.items() if k != "params"})
        self.state = state
        self._addresses.clear()  # holds the replaced state arrays until the next step otherwise

    def __repr__(self):
        lines = [type(self).__name__ + " ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for k in sorted(k for k in g if k != "params"):
                lines.append(f"    {k}: {g[k]}")
        return "\n".join(lines) + "\n)"


def _group_with_checked_params(group, defaults):
    """A copy of a parameter group with its params as a list, or torch's error for a group
    that is not a dict, params in a set (no stable order), or a param that is not a leaf
    Tensor (a non-leaf's .grad is never filled, so it would silently never train)."""
    if not isinstance(group, dict):
        raise TypeError(f"param_group must be a dict, but got {type(group)}")
    group = dict(group)
    ps = group["params"]
    if isinstance(ps, set):
        raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering of "
                        "tensors in sets will change between runs. Please use a list instead.")
    group["params"] = [ps] if isinstance(ps, Tensor) else list(ps)
    # torch 2.x takes named parameters, (name, tensor) pairs, and keeps the names
    names = [p[0] for p in group["params"] if isinstance(p, tuple)]
    if names:
        if len(names) != len(group["params"]):
            raise ValueError("all optimizer params should be with/without names. Some param names are missing")
        group["params"], group["param_names"] = [p[1] for p in group["params"]], names
    for p in group["params"]:
        if not isinstance(p, Tensor):
            raise TypeError("optimizer can only optimize Tensors, but one of the params is " + typename(p))
        if not defaults.get("differentiable") and not (p.is_leaf or p.retains_grad):
            raise ValueError("can't optimize a non-leaf Tensor")
    return group


def _check_params_unique(group, groups):
    """torch's warning for a parameter twice in one group and error for one in two groups
    (its step would update it twice)."""
    ids = [id(p) for p in group["params"]]
    unique = set(ids)
    if len(ids) != len(unique):
        warnings.warn("optimizer contains a parameter group with duplicate parameters; in future, this will cause "
                      "an error; see github.com/pytorch/pytorch/issues/40967 for more information", stacklevel=4)
    if any(id(p) in unique for g in groups for p in g["params"]):
        raise ValueError("some parameters appear in more than one parameter group")
    if any(("param_names" in g) != ("param_names" in group) for g in groups):
        raise ValueError("all optimizer param groups should be with/without names. cannot add param group "
                         f"{'with' if 'param_names' in group else 'without'} names to the optimizer")


def _check_hyperparameters(checks):
    """torch's ValueError for the first (ok, message) of an optimizer's constructor arguments
    that is not ok."""
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def _data(p):
    """The parameter's (or a state tensor's) array, written in place (the optimizer's update
    is not recorded)."""
    d = p._data
    return d if _device.on_device(d) else p._array()


def _zeros_like(d):
    return _device.zeros_like(d) if _device.on_device(d) else np.zeros_like(d)


def _empty_like(d):
    return _device.empty_like(d) if _device.on_device(d) else np.empty_like(d)


def _state_tensor(arr):
    """Per-parameter state (exp_avg, momentum_buffer...) is a Tensor, as in torch, so users
    can inspect it; the update writes its array in place."""
    return Tensor._make(arr)


def _load_value(v, p, key):
    """A loaded state value: a copy, on its parameter's device and, for a floating
    parameter, in its dtype (torch's _process_value_according_to_param_policy; 'step' is
    kept as it is)."""
    v = _copy_value(v)
    if isinstance(v, Tensor) and key != "step" and p is not None:
        pd = p._data
        dtype = pd.dtype if pd.dtype.kind in "fc" else v._data.dtype
        v._data = _device.move(v._data, _device.on_device(pd), dtype)
    return v


def _copy_value(v):
    # state dicts hold copies so that a saved dict does not change as training goes on
    if isinstance(v, Tensor):
        d = v._data
        return Tensor._make(d.copy() if _device.on_device(d) else np.array(d, copy=True))
    if isinstance(v, np.ndarray):
        return Tensor._make(v.copy())
    return copy.copy(v)
