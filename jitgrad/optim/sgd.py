"""SGD with momentum, dampening, Nesterov and weight decay, as torch.optim.SGD."""
import numpy as np

from jitgrad.optim import _checks, _device, _kernels
from jitgrad.optim.optimizer import Optimizer, _check_hyperparameters, _data, _empty_like, _state_tensor, required

_ndarray = np.ndarray


class SGD(Optimizer):
    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, maximize=False):
        _check_hyperparameters([
            (lr is required or not lr < 0.0, f"Invalid learning rate: {lr}"),
            (not momentum < 0.0, f"Invalid momentum value: {momentum}"),
            (not weight_decay < 0.0, f"Invalid weight_decay value: {weight_decay}"),
            (not nesterov or (momentum > 0 and dampening == 0), "Nesterov momentum requires a momentum and zero "
                                                                 "dampening")])
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    def _check(self, group):
        """What torch's ops would say of each parameter (`_replay`); the common case, where
        gradient and buffer have the parameter's shape, costs a few attribute reads."""
        params = self._params_with_grad(group)
        mom = group["momentum"]
        for p in params:
            d, g = p._data, p._grad._data  # (p.grad is not None: _params_with_grad)
            buf = self.state.get(p, {}).get("momentum_buffer") if mom else None
            buf = None if buf is None else buf._data
            if not (type(d) is _ndarray and type(g) is _ndarray and buf is None):  # both on the host: same device
                _device.check_same_device(d, g, buf)
            if g.shape == d.shape and (buf is None or buf.shape == d.shape):
                continue
            self._replay(group, d, g, buf)
        return params

    @staticmethod
    def _replay(group, d, g, buf):
        """torch's ops, by shape: grad (+ wd * param), buf.mul_().add_(grad) (or buf = grad),
        grad (+ momentum * buf), param.add_(grad)."""
        gs = _checks.broadcast(g.shape, d.shape) if group["weight_decay"] else g.shape
        if group["momentum"]:
            bs = gs if buf is None else _checks.inplace(buf.shape, gs)
            gs = _checks.broadcast(gs, bs) if group["nesterov"] else bs
        _checks.inplace(d.shape, gs)

    def _update(self, group, params):
        lr, mom, damp, wd = group["lr"], group["momentum"], group["dampening"], group["weight_decay"]
        batch = _kernels.Batch(self._addresses)
        device = _device.DeviceBatch()
        compiled = _kernels.available()
        maximize = group["maximize"]
        for p in params:
            d = p._data
            if type(d) is not _ndarray:
                d = _data(p)
            g = p._grad._data  # (p.grad is not None: _check)
            buf, first = None, False
            if mom:
                state = self.state.setdefault(p, {})
                if state.get("momentum_buffer") is None:
                    state["momentum_buffer"] = _state_tensor(_empty_like(d))
                    first = True
                buf = _data(state["momentum_buffer"])
            if (type(d) is not _ndarray or type(g) is not _ndarray) and (_device.on_device(d) or _device.on_device(g)):
                # (the kernel negates for maximize)
                device.add(d, g, (d if buf is None else buf,), (lr, wd, mom, 1 - damp, float(first)))
            else:
                if maximize:
                    g = -g
                if not (compiled and _kernels.sgd_add(batch, p, d, g, buf, lr, wd, mom, damp, first)):
                    self._numpy_update(d, g, buf, lr, wd, mom, damp, first, group["nesterov"])
            p._bump()
        _kernels.sgd_run(batch, bool(mom), group["nesterov"])  # one call for the whole group
        device.run("sgd", bool(mom), group["nesterov"], group["maximize"])  # and one launch

    @staticmethod
    def _numpy_update(d, g, buf, lr, wd, mom, damp, first, nesterov):
        """The same update as kernels/optim.sgd, for arrays it cannot take and for the
        NUMBA_DISABLE_JIT pass (so both forms are checked against torch in CI)."""
        if wd:
            g = g + wd * d
        if buf is not None:
            if first:
                buf[...] = g                   # torch: buf = clone(grad)
            else:
                buf *= mom
                buf += (1 - damp) * g
            g = g + mom * buf if nesterov else buf
        d -= lr * g
