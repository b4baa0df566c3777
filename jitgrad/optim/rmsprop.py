"""RMSprop, as torch.optim.RMSprop (same order of floating-point operations): the gradient
scaled by the root of a running mean of its square (centered: of its variance), with
optional momentum, weight decay and maximize."""
import numpy as np

from jitgrad.optim import _checks, _device, _kernels
from jitgrad.optim.optimizer import Optimizer, _check_hyperparameters, _data, _state_tensor, _zeros_like

_STATE = ("square_avg", "grad_avg", "momentum_buffer")


class RMSprop(Optimizer):
    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False,
                 capturable=False, foreach=None, maximize=False, differentiable=False):
        _check_hyperparameters((0.0 <= value, f"Invalid {name}: {value}") for name, value in (
            ("learning rate", lr), ("epsilon value", eps), ("momentum value", momentum),
            ("weight_decay value", weight_decay), ("alpha value", alpha)))
        if differentiable:
            raise NotImplementedError("jitgrad's optimizers update outside the graph: differentiable=True is not "
                                      "supported")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered, capturable=capturable, foreach=foreach, maximize=maximize,
                                      differentiable=differentiable))

    def _state_arrays(self, group, p):
        """square_avg, grad_avg (centered) and momentum_buffer (momentum) of p, or None each."""
        state = self.state.get(p) or {}
        wanted = (True, group["centered"], group["momentum"] > 0)
        return tuple(state[k]._data if w and k in state else None for k, w in zip(_STATE, wanted))

    def _check(self, group):
        """What torch's ops would say of each parameter (`_replay`); the common case, where
        gradient and state have the parameter's shape and dtype, costs a few attribute reads."""
        params = self._params_with_grad(group)
        for p in params:
            d, g = p._data, p.grad._data
            arrays = self._state_arrays(group, p)
            _device.check_same_device(d, g, *arrays)
            if g.shape == d.shape and g.dtype == d.dtype and all(
                    a is None or (a.shape == d.shape and a.dtype == d.dtype) for a in arrays):
                continue
            self._replay(group, d, g, *arrays)
        return params

    @staticmethod
    def _replay(group, d, g, sq, gavg, buf):
        """torch's ops, by shape and dtype: grad (+ wd * param), square_avg.mul_().addcmul_(grad,
        grad), grad_avg.lerp_(grad), avg = square_avg.addcmul(grad_avg, grad_avg).sqrt_(),
        buf.mul_().addcdiv_(grad, avg) and param.add_(buf), or param.addcdiv_(grad, avg).
        A new state is made like the parameter."""
        wd = group["weight_decay"] != 0
        gs = _checks.broadcast(g.shape, d.shape) if wd else g.shape
        avg = _checks.inplace(d.shape if sq is None else sq.shape, gs)
        if group["centered"]:
            g_dtype = np.result_type(g.dtype, d.dtype) if wd else g.dtype
            _checks.lerp_dtype(d.dtype if gavg is None else gavg.dtype, g_dtype)
            ga = _checks.inplace(d.shape if gavg is None else gavg.shape, gs)
            avg = _checks.broadcast(avg, ga)
        step = _checks.broadcast(gs, avg)
        if group["momentum"] > 0:
            step = _checks.inplace(d.shape if buf is None else buf.shape, step)
        _checks.inplace(d.shape, step)

    def _update(self, group, params):
        lr, alpha, eps, wd, mom = group["lr"], group["alpha"], group["eps"], group["weight_decay"], group["momentum"]
        centered, momentum = bool(group["centered"]), mom > 0
        batch = _kernels.Batch(self._addresses)
        device = _device.DeviceBatch()
        compiled = _kernels.available()
        for p in params:
            d = _data(p)
            g = p.grad._data
            state = self.state.setdefault(p, {})
            if not state:
                state["step"] = 0.0
                state["square_avg"] = _state_tensor(_zeros_like(d))
            if momentum and "momentum_buffer" not in state:
                state["momentum_buffer"] = _state_tensor(_zeros_like(d))
            if centered and "grad_avg" not in state:
                state["grad_avg"] = _state_tensor(_zeros_like(d))
            state["step"] += 1
            sq = _data(state["square_avg"])
            gavg = _data(state["grad_avg"]) if centered else None
            buf = _data(state["momentum_buffer"]) if momentum else None
            scalars = _scalars(d.dtype, lr, alpha, eps, wd, mom)
            if _device.on_device(d) or _device.on_device(g):  # the kernel negates for maximize
                device.add(d, g, (sq, sq if gavg is None else gavg, sq if buf is None else buf), scalars)
            else:
                if group["maximize"]:
                    g = -g
                if not (compiled and _kernels.rmsprop_add(batch, p, d, g, sq, gavg, buf, scalars)):
                    _numpy_update(d, g, sq, gavg, buf, scalars)
            p._bump()
        _kernels.rmsprop_run(batch, centered, momentum)  # one call for the whole group
        device.run("rmsprop", centered, momentum, group["maximize"])  # and one launch


def _scalars(dtype, lr, alpha, eps, wd, mom):
    """The kernel's scalars. torch's lerp_ with weight w = 1 - alpha computes, when w >= 0.5,
    with 1 - w rounded in the parameter's dtype: that is what lerp_rest holds."""
    w = np.dtype(dtype).type(1 - alpha)
    return (alpha, 1 - alpha, float(np.dtype(dtype).type(1) - w), eps, wd, mom, -lr)


def _numpy_update(d, g, sq, gavg, buf, scalars):
    """The same update as kernels/optim.rmsprop, for arrays it cannot take and for the
    NUMBA_DISABLE_JIT pass (so both forms are checked against torch in CI)."""
    alpha, one_alpha, lerp_rest, eps, wd, mom, neg_lr = scalars
    if wd:
        g = g + wd * d
    sq *= alpha
    sq += one_alpha * g * g
    if gavg is not None:
        if one_alpha < 0.5:
            gavg += one_alpha * (g - gavg)
        else:
            gavg[...] = g - (g - gavg) * lerp_rest
        avg = np.sqrt(sq - gavg * gavg)
    else:
        avg = np.sqrt(sq)
    avg += eps
    if buf is not None:
        buf *= mom
        buf += g / avg
        d += neg_lr * buf
    else:
        d += neg_lr * g / avg
