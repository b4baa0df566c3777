"""F.linear and torch.addmm: values, gradients (double backward too), the graph torch
records (AddmmBackward0 / MmBackward0 over TBackward0, views around non-2-D input) and the
dtype errors, against torch 2.13."""
import numpy as np
import pytest
from conftest import both

torch = pytest.importorskip("torch")


def chain(t):
    """(name, [next names]) down the first non-leaf input, as the graph prints."""
    out, f = [], t.grad_fn
    while f is not None:
        nxt = [None if g[0] is None else g[0].name() for g in f.next_functions]
        out.append((f.name(), nxt))
        f = next((g[0] for g in f.next_functions if g[0] is not None and "Accumulate" not in g[0].name()), None)
    return out


@pytest.mark.parametrize("shape", [(3, 4), (4,), (2, 3, 4), (0, 4)], ids=["2d", "1d", "3d", "empty"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_linear_values_grads_and_graph(shape, bias, dtype):
    r = np.random.default_rng(40)
    x, w, b = r.normal(size=shape), r.normal(size=(5, 4)), r.normal(size=5)
    g = r.normal(size=shape[:-1] + (5,))

    def run(T):
        dt = getattr(T, dtype)
        X = T.tensor(x, dtype=dt, requires_grad=True)
        W = T.tensor(w, dtype=dt, requires_grad=True)
        B = T.tensor(b, dtype=dt, requires_grad=True) if bias else None
        y = T.nn.functional.linear(X, W, B)
        (y * T.tensor(g, dtype=dt)).sum().backward()
        return dict(y=y, gx=X.grad, gw=W.grad, gb=B.grad if bias else None,
                    graph=chain(y) if shape != (4,) or bias else None)

    both(run, dtype)


def test_linear_double_backward_and_partial_requires_grad():
    r = np.random.default_rng(41)
    x, w, b = r.normal(size=(3, 4)), r.normal(size=(2, 4)), r.normal(size=2)

    def run(T):
        X, W, B = (T.tensor(a, requires_grad=True) for a in (x, w, b))
        y = T.nn.functional.linear(X * X, W, B)
        gx, gw = T.autograd.grad((y ** 3).sum(), (X, W), create_graph=True)
        ((gx ** 2).sum() + (gw * gw).sum()).backward()
        frozen = T.nn.functional.linear(X, T.tensor(w), T.tensor(b))   # only the input needs grad
        (gf,) = T.autograd.grad(frozen.sum(), X)
        return dict(gx=gx, gw=gw, X=X.grad, W=W.grad, B=B.grad, gf=gf)

    both(run)


def test_addmm_beta_alpha_and_broadcast_input():
    r = np.random.default_rng(42)
    inp, a, b = r.normal(size=(1, 3)), r.normal(size=(2, 4)), r.normal(size=(4, 3))

    def run(T):
        I, A, B = (T.tensor(v, requires_grad=True) for v in (inp, a, b))  # noqa: E741
        y = T.addmm(I, A, B, beta=0.5, alpha=-2.0)
        y2 = I.addmm(A, B.t().contiguous().t())   # a transposed operand
        ((y * y).sum() + y2.sum()).backward()
        return dict(y=y, y2=y2, gi=I.grad, ga=A.grad, gb=B.grad, graph=chain(y))

    both(run)


def test_linear_dtype_errors():
    def run(T):
        x, w, b = T.ones(2, 4, dtype=T.float64), T.ones(3, 4), T.ones(3)
        out = {}
        for name, f in dict(mat=lambda: T.nn.functional.linear(x, w, b),
                            nobias=lambda: T.nn.functional.linear(x, w),
                            bias=lambda: T.nn.functional.linear(x, w.double(), b),
                            addmm=lambda: T.addmm(b.double(), x, w.t())).items():
            try:
                f()
                out[name] = None
            except RuntimeError as e:
                out[name] = str(e)
        return out

    both(run)


@pytest.mark.parametrize("shapes", [((6, 5, 4), (6, 4, 1)), ((6, 5, 4), (1, 4, 1)), ((1, 5, 4), (6, 4, 1)),
                                    ((2, 3, 5, 4), (3, 4, 1))],
                         ids=["batched", "bcast_vec", "bcast_mat", "4d"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_batched_matrix_times_vector_grads(shapes, dtype):
    """A matrix times a one-column matrix per batch (vmap's weight per sample) has its own
    backward loop in the matmul kernel; its gradients, broadcast batches included, as torch's."""
    r = np.random.default_rng(41)
    a, v = r.normal(size=shapes[0]), r.normal(size=shapes[1])

    def run(T):
        dt = getattr(T, dtype)
        A = T.tensor(a, dtype=dt, requires_grad=True)
        V = T.tensor(v, dtype=dt, requires_grad=True)
        y = A @ V
        (y * y).sum().backward()
        return dict(y=y, ga=A.grad, gv=V.grad)

    both(run, dtype)
