"""Adadelta, as torch.optim.Adadelta (its single-tensor update, in torch's order of
operations): the step is the gradient scaled by the ratio of the roots of two running
means, of past squared steps and of squared gradients, times lr.

The update runs as numpy in-place array operations, on CPU arrays; unlike SGD, Adam and
RMSprop it has no compiled kernel and no CUDA form yet (a CUDA parameter raises).
"""
import numpy as np

from jitgrad.optim import _checks, _device
from jitgrad.optim.optimizer import Optimizer, _check_hyperparameters, _data, _state_tensor, _zeros_like


class Adadelta(Optimizer):
    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, foreach=None, *, capturable=False,
                 maximize=False, differentiable=False):
        _check_hyperparameters((
            (0.0 <= lr, f"Invalid learning rate: {lr}"),
            (0.0 <= rho <= 1.0, f"Invalid rho value: {rho}"),
            (0.0 <= eps, f"Invalid epsilon value: {eps}"),
            (0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")))
        if differentiable:
            raise NotImplementedError("jitgrad's optimizers update outside the graph: differentiable=True is not "
                                      "supported")
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, foreach=foreach,
                                      capturable=capturable, maximize=maximize, differentiable=differentiable))

    def _check(self, group):
        """torch's errors, before anything changes: the CUDA form is missing, and a gradient or
        state whose shape does not fit the in-place ops (optim/_checks)."""
        params = self._params_with_grad(group)
        for p in params:
            d, g = p._data, p.grad._data
            if _device.on_device(d) or _device.on_device(g):
                raise NotImplementedError("jitgrad's Adadelta has no CUDA update yet: use SGD, Adam, AdamW or RMSprop "
                                          "on CUDA parameters")
            state = self.state.get(p) or {}
            gs = _checks.broadcast(g.shape, d.shape) if group["weight_decay"] != 0 else g.shape
            for key in ("square_avg", "acc_delta"):
                shape = state[key]._data.shape if key in state else d.shape
                gs = _checks.broadcast(shape, gs) if key == "acc_delta" else gs
                _checks.inplace(shape, gs)
            _checks.inplace(d.shape, gs)
        return params

    def _update(self, group, params):
        lr, rho, eps, wd = group["lr"], group["rho"], group["eps"], group["weight_decay"]
        for p in params:
            d = _data(p)
            g = p.grad._data
            state = self.state.setdefault(p, {})
            if not state:
                state["step"] = 0.0
                state["square_avg"] = _state_tensor(_zeros_like(d))
                state["acc_delta"] = _state_tensor(_zeros_like(d))
            state["step"] += 1
            sq, acc = _data(state["square_avg"]), _data(state["acc_delta"])
            if group["maximize"]:
                g = -g
            if wd != 0:
                g = g + wd * d                                  # grad.add(param, alpha=weight_decay)
            sq *= rho                                           # square_avg.mul_(rho)
            sq += (1 - rho) * g * g                             # .addcmul_(grad, grad, value=1 - rho)
            std = np.sqrt(sq + eps)                             # square_avg.add(eps).sqrt_()
            delta = np.sqrt(acc + eps)                          # acc_delta.add(eps).sqrt_()
            delta /= std                                        # delta.div_(std).mul_(grad)
            delta *= g
            acc *= rho                                          # acc_delta.mul_(rho)
            acc += (1 - rho) * delta * delta                    # .addcmul_(delta, delta, value=1 - rho)
            d -= lr * delta                                     # param.add_(delta, alpha=-lr)
            p._bump()
