"""The optimizers' one-call-per-step kernel (optim/_kernels.Batch) against torch 2.13:
parameters of two dtypes and a non-contiguous one in one group, and the cases where the
arrays whose addresses it keeps change under it (p.data replaced, load_state_dict,
zero-size parameters)."""
import numpy as np
import pytest
from conftest import both

torch = pytest.importorskip("torch")

OPTS = [("Adam", dict(lr=0.01)), ("AdamW", dict(lr=0.01, weight_decay=0.1, amsgrad=True)),
        ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)), ("SGD", dict(lr=0.1))]


def grads(step, shape):
    return np.sin(np.arange(int(np.prod(shape))) * 0.7 + step).reshape(shape)


@pytest.mark.parametrize("name,kw", OPTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OPTS)])
def test_mixed_dtypes_noncontiguous_and_replaced_arrays(name, kw):
    r = np.random.default_rng(50)
    a, b, c = r.normal(size=(3, 4)), r.normal(size=5), r.normal(size=(4, 3))

    def run(T):
        pa = T.tensor(a, requires_grad=True)                      # float64
        pb = T.tensor(b, dtype=T.float32, requires_grad=True)     # float32, same group
        pc = T.tensor(c, requires_grad=True)
        pz = T.zeros(0, requires_grad=True)                       # zero-size
        opt = getattr(T.optim, name)([pa, pb, pc, pz], **kw)
        out = []
        for step in range(6):
            for p in (pa, pb, pc, pz):
                p.grad = T.tensor(grads(step, tuple(p.shape)), dtype=p.dtype)
            pc.grad = pc.grad.t().contiguous().t()                # a non-contiguous gradient
            if step == 2:
                with T.no_grad():
                    pa.data = pa.data * 0.5                       # the parameter's array is replaced
            if step == 4:
                opt.load_state_dict(opt.state_dict())             # the state arrays are replaced
            opt.step()
            out.append([pa.detach().clone(), pb.detach().clone(), pc.detach().clone()])
        return out

    both(run, "float32")  # float32 tolerance: one parameter is float32 (torch may fuse multiply-adds)
