"""Adam and AdamW, as torch.optim.Adam / AdamW (same order of floating-point operations)."""
import math

import numpy as np

from jitgrad.optim import _checks, _device, _kernels
from jitgrad.optim.optimizer import Optimizer, _check_hyperparameters, _data, _state_tensor, _zeros_like


def _implementation_flags(foreach, capturable, differentiable, fused):
    """torch's choices of implementation (for-each, fused kernels): one update here computes
    what each of them does, so they are accepted (code such as nanoGPT's configure_optimizers
    asks for fused=True when the signature has it); what would change the semantics is refused."""
    if fused and foreach:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
    if differentiable:
        raise NotImplementedError("jitgrad's optimizers do not record their step for autograd (differentiable=True)")
    if capturable:
        raise NotImplementedError("jitgrad's optimizers have no CUDA-graph capturable step (capturable=True)")


class Adam(Optimizer):
    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False,
                 maximize=False, *, foreach=None, capturable=False, differentiable=False, fused=None):
        _implementation_flags(foreach, capturable, differentiable, fused)
        _check_hyperparameters([
            (0.0 <= lr, f"Invalid learning rate: {lr}"),
            (0.0 <= eps, f"Invalid epsilon value: {eps}"),
            (0.0 <= betas[0] < 1.0, f"Invalid beta parameter at index 0: {betas[0]}"),
            (0.0 <= betas[1] < 1.0, f"Invalid beta parameter at index 1: {betas[1]}"),
            (0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")])
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize))

    def _check(self, group):
        """What torch's ops would say of each parameter (`_replay`); the common case, where
        gradient and state have the parameter's shape and dtype, costs a few attribute reads."""
        params = self._params_with_grad(group)
        amsgrad = group["amsgrad"]
        for p in params:
            d, g = p._data, p.grad._data
            m = v = vmax = None
            state = self.state.get(p)
            if state:
                m, v = state["exp_avg"]._data, state["exp_avg_sq"]._data
                vmax = state.get("max_exp_avg_sq") if amsgrad else None
                vmax = None if vmax is None else vmax._data
            _device.check_same_device(d, g, m, v, vmax)
            s, dt = d.shape, d.dtype
            if g.shape == s and g.dtype == dt and (m is None or (m.shape == s and m.dtype == dt and v.shape == s)) \
                    and (vmax is None or vmax.shape == s):
                continue
            self._replay(group, d, g, m, v, vmax)
        return params

    def _replay(self, group, d, g, m, v, vmax):
        """torch's ops, by shape and dtype: grad (+ wd * param), exp_avg.lerp_(grad),
        exp_avg_sq.mul_().addcmul_(grad, grad), max(max_exp_avg_sq, exp_avg_sq),
        param.addcdiv_(exp_avg, denom). A new state is made like the parameter."""
        coupled_wd = group["weight_decay"] != 0 and not self._decoupled
        gs = _checks.broadcast(g.shape, d.shape) if coupled_wd else g.shape
        # grad + wd * param promotes, then lerp_ wants exp_avg's dtype (made like the param)
        g_dtype = np.result_type(g.dtype, d.dtype) if coupled_wd else g.dtype
        _checks.lerp_dtype(d.dtype if m is None else m.dtype, g_dtype)
        ms = _checks.inplace(d.shape if m is None else m.shape, gs)
        vs = _checks.inplace(d.shape if v is None else v.shape, gs)
        if vmax is not None:
            vs = _checks.inplace(vmax.shape, vs)
        _checks.inplace(d.shape, _checks.broadcast(ms, vs))

    def _update(self, group, params):
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        batch = _kernels.Batch(self._addresses)
        device = _device.DeviceBatch()
        compiled = _kernels.available()
        for p in params:
            d = _data(p)
            g = p.grad._data
            state = self.state.setdefault(p, {})
            if not state:
                state["step"] = 0.0
                state["exp_avg"] = _state_tensor(_zeros_like(d))
                state["exp_avg_sq"] = _state_tensor(_zeros_like(d))
            if group["amsgrad"] and "max_exp_avg_sq" not in state:
                state["max_exp_avg_sq"] = _state_tensor(_zeros_like(d))
            state["step"] += 1
            step = state["step"]
            m, v = _data(state["exp_avg"]), _data(state["exp_avg_sq"])
            vmax = _data(state["max_exp_avg_sq"]) if group["amsgrad"] else None
            bc1 = 1 - b1 ** step
            bc2_sqrt = math.sqrt(1 - b2 ** step)
            if _device.on_device(d) or _device.on_device(g):  # the kernel negates for maximize
                device.add(d, g, (m, v, d if vmax is None else vmax),
                           (1 - b1, b2, 1 - b2, eps, wd, lr / bc1, bc2_sqrt, 1 - lr * wd))
            else:
                if group["maximize"]:
                    g = -g
                if not (compiled and _kernels.adam_add(batch, p, d, g, m, v, vmax, lr, b1, b2, eps, wd, lr / bc1,
                                                       bc2_sqrt)):
                    self._numpy_update(d, g, m, v, vmax, lr, b1, b2, eps, wd, bc1, bc2_sqrt)
            p._bump()
        _kernels.adam_run(batch, self._decoupled, group["amsgrad"])  # one call for the whole group
        device.run("adam", self._decoupled, group["amsgrad"], group["maximize"])  # and one launch

    def _numpy_update(self, d, g, m, v, vmax, lr, b1, b2, eps, wd, bc1, bc2_sqrt):
        """The same update as kernels/optim.adam, for arrays it cannot take and for the
        NUMBA_DISABLE_JIT pass (so both forms are checked against torch in CI)."""
        if wd:
            if self._decoupled:
                d *= 1 - lr * wd
            else:
                g = g + wd * d
        m += (g - m) * (1 - b1)            # torch: exp_avg.lerp_(grad, 1 - beta1)
        v *= b2
        v += (1 - b2) * g * g
        if vmax is not None:
            np.maximum(vmax, v, out=vmax)
            denom = np.sqrt(vmax) / bc2_sqrt + eps
        else:
            denom = np.sqrt(v) / bc2_sqrt + eps
        d -= (lr / bc1) * (m / denom)


class AdamW(Adam):
    """Adam with decoupled weight decay (the parameter shrinks by lr * weight_decay)."""
    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False,
                 maximize=False, *, foreach=None, capturable=False, differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize, foreach=foreach,
                         capturable=capturable, differentiable=differentiable, fused=fused)
