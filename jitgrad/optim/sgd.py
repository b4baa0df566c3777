"""SGD with momentum, dampening, Nesterov and weight decay, as torch.optim.SGD."""
from .optimizer import Optimizer, _data, _state_tensor, required


class SGD(Optimizer):
    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0, nesterov=False, maximize=False):
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    def _update(self, group):
        lr, mom, damp, wd = group["lr"], group["momentum"], group["dampening"], group["weight_decay"]
        for p in self._params_with_grad(group):
            d = _data(p)
            g = p.grad._data
            if group["maximize"]:
                g = -g
            if wd:
                g = g + wd * d
            if mom:
                state = self.state.setdefault(p, {})
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = g.copy()
                    state["momentum_buffer"] = _state_tensor(buf)
                else:
                    buf = buf._data
                    buf *= mom
                    buf += (1 - damp) * g
                g = g + mom * buf if group["nesterov"] else buf
            d -= lr * g
            p._bump()
