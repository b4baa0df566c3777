"""pytorch/tutorials, beginner_source/examples_* (Learning PyTorch with Examples) ported as
tests: fit a third-order polynomial to sin(x) with tensors and hand-written gradients,
autograd, a custom autograd Function, nn, optim (RMSprop) and a custom Module, and the
dynamic network. Each runs its tutorial's code with jitgrad and with torch for fewer
steps, from the same starting weights (the tutorials draw them with randn, whose numbers
differ between the libraries; they are overwritten with the same values after), and
the losses and weights must agree."""
import math
import random

import numpy as np
import pytest
from conftest import both, to_np

import jitgrad

torch = pytest.importorskip("torch")

START = np.random.default_rng(0).normal(size=5)


def weights(T, dtype, requires_grad):
    """The tutorials' `torch.randn((), dtype=dtype, requires_grad=...)` four times, set to START."""
    ws = [T.randn((), dtype=dtype, requires_grad=requires_grad) for _ in range(4)]
    with T.no_grad():
        for w, v in zip(ws, START):
            w.copy_(T.tensor(v, dtype=dtype))
    return ws


def set_start(T, model):
    with T.no_grad():
        for p, v in zip(model.parameters(), START):
            p.copy_(T.full(tuple(p.shape), float(v)) * (0.1 if p.dim() else 1.0))
    return model


def test_polynomial_tensor():
    def run(T):
        dtype = T.float
        device = T.device("cpu")
        x = T.linspace(-math.pi, math.pi, 2000, device=device, dtype=dtype)
        y = T.sin(x)
        a, b, c, d = weights(T, dtype, False)
        learning_rate = 1e-6
        losses = []
        for t in range(200):
            y_pred = a + b * x + c * x ** 2 + d * x ** 3
            loss = (y_pred - y).pow(2).sum().item()
            if t % 100 == 99:
                losses.append(loss)
            grad_y_pred = 2.0 * (y_pred - y)
            grad_a = grad_y_pred.sum()
            grad_b = (grad_y_pred * x).sum()
            grad_c = (grad_y_pred * x ** 2).sum()
            grad_d = (grad_y_pred * x ** 3).sum()
            a -= learning_rate * grad_a
            b -= learning_rate * grad_b
            c -= learning_rate * grad_c
            d -= learning_rate * grad_d
        return T.tensor(losses), [a, b, c, d]
    both(run, dtype="float32")


def test_polynomial_autograd():
    def run(T):
        dtype = T.float
        device = "cuda" if T.cuda.is_available() and T is torch else "cpu"
        T.set_default_device(device)
        try:
            x = T.linspace(-math.pi, math.pi, 2000, dtype=dtype)
            y = T.sin(x)
            a, b, c, d = weights(T, dtype, True)
            learning_rate = 1e-6
            losses = []
            for t in range(200):
                y_pred = a + b * x + c * x ** 2 + d * x ** 3
                loss = (y_pred - y).pow(2).sum()
                if t % 100 == 99:
                    losses.append(loss.item())
                loss.backward()
                with T.no_grad():
                    a -= learning_rate * a.grad
                    b -= learning_rate * b.grad
                    c -= learning_rate * c.grad
                    d -= learning_rate * d.grad
                    a.grad = None
                    b.grad = None
                    c.grad = None
                    d.grad = None
        finally:
            T.set_default_device("cpu")
        return T.tensor(losses), [a, b, c, d]
    both(run, dtype="float32")


def test_polynomial_custom_function():
    def run(T):
        class LegendrePolynomial3(T.autograd.Function):
            @staticmethod
            def forward(ctx, input):
                ctx.save_for_backward(input)
                return 0.5 * (5 * input ** 3 - 3 * input)

            @staticmethod
            def backward(ctx, grad_output):
                input, = ctx.saved_tensors
                return grad_output * 1.5 * (5 * input ** 2 - 1)

        dtype = T.float
        x = T.linspace(-math.pi, math.pi, 2000, dtype=dtype)
        y = T.sin(x)
        a, b, c, d = weights(T, dtype, True)
        with T.no_grad():
            a.fill_(0.0)
            b.fill_(-1.0)
            c.fill_(0.0)
            d.fill_(0.3)
        learning_rate = 5e-6
        losses = []
        for t in range(200):
            P3 = LegendrePolynomial3.apply
            y_pred = a + b * P3(c + d * x)
            loss = (y_pred - y).pow(2).sum()
            if t % 100 == 99:
                losses.append(loss.item())
            loss.backward()
            with T.no_grad():
                a -= learning_rate * a.grad
                b -= learning_rate * b.grad
                c -= learning_rate * c.grad
                d -= learning_rate * d.grad
                a.grad = None
                b.grad = None
                c.grad = None
                d.grad = None
        return T.tensor(losses), [a, b, c, d], type(y_pred.grad_fn).__name__
    both(run, dtype="float32")


def test_polynomial_nn():
    def run(T):
        x = T.linspace(-math.pi, math.pi, 2000)
        y = T.sin(x)
        p = T.tensor([1, 2, 3])
        xx = x.unsqueeze(-1).pow(p)
        model = set_start(T, T.nn.Sequential(T.nn.Linear(3, 1), T.nn.Flatten(0, 1)))
        loss_fn = T.nn.MSELoss(reduction="sum")
        learning_rate = 1e-6
        losses = []
        for t in range(200):
            y_pred = model(xx)
            loss = loss_fn(y_pred, y)
            if t % 100 == 99:
                losses.append(loss.item())
            model.zero_grad()
            loss.backward()
            with T.no_grad():
                for param in model.parameters():
                    param -= learning_rate * param.grad
        linear_layer = model[0]
        return (T.tensor(losses), xx.dtype == T.float32, tuple(xx.shape), linear_layer.bias,
                linear_layer.weight[:, 0], linear_layer.weight[:, 1], linear_layer.weight[:, 2])
    both(run, dtype="float32")


def test_polynomial_optim():
    def run(T):
        x = T.linspace(-math.pi, math.pi, 2000)
        y = T.sin(x)
        p = T.tensor([1, 2, 3])
        xx = x.unsqueeze(-1).pow(p)
        model = set_start(T, T.nn.Sequential(T.nn.Linear(3, 1), T.nn.Flatten(0, 1)))
        loss_fn = T.nn.MSELoss(reduction="sum")
        learning_rate = 1e-3
        optimizer = T.optim.RMSprop(model.parameters(), lr=learning_rate)
        losses = []
        for t in range(200):
            y_pred = model(xx)
            loss = loss_fn(y_pred, y)
            if t % 100 == 99:
                losses.append(loss.item())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return T.tensor(losses), [q.detach() for q in model.parameters()]
    j, t = run(jitgrad), run(torch)
    # RMSprop moves a weight by about lr whatever its gradient's size, so the x^2 weight
    # (0 at the optimum) steps back and forth across 0 by the sign of a sum that float32
    # rounds differently in the two libraries: weights agree to a small part of lr
    np.testing.assert_allclose(to_np(j[0]), to_np(t[0]), rtol=1e-4)
    for a, b in zip(j[1], t[1]):
        np.testing.assert_allclose(to_np(a), to_np(b), rtol=1e-4, atol=1e-5)
    assert j[0][-1] < j[0][0]


def test_polynomial_module():
    def run(T):
        class Polynomial3(T.nn.Module):
            def __init__(self):
                super().__init__()
                self.a = T.nn.Parameter(T.randn(()))
                self.b = T.nn.Parameter(T.randn(()))
                self.c = T.nn.Parameter(T.randn(()))
                self.d = T.nn.Parameter(T.randn(()))

            def forward(self, x):
                return self.a + self.b * x + self.c * x ** 2 + self.d * x ** 3

            def string(self):
                return f"y = {self.a.item()} + {self.b.item()} x + {self.c.item()} x^2 + {self.d.item()} x^3"

        x = T.linspace(-math.pi, math.pi, 2000)
        y = T.sin(x)
        model = set_start(T, Polynomial3())
        criterion = T.nn.MSELoss(reduction="sum")
        optimizer = T.optim.SGD(model.parameters(), lr=1e-6)
        losses = []
        for t in range(200):
            y_pred = model(x)
            loss = criterion(y_pred, y)
            if t % 100 == 99:
                losses.append(loss.item())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return T.tensor(losses), [q.detach() for q in model.parameters()], model.string().count("x^")
    both(run, dtype="float32")


def test_dynamic_net():
    def run(T):
        class DynamicNet(T.nn.Module):
            def __init__(self):
                super().__init__()
                self.a = T.nn.Parameter(T.randn(()))
                self.b = T.nn.Parameter(T.randn(()))
                self.c = T.nn.Parameter(T.randn(()))
                self.d = T.nn.Parameter(T.randn(()))
                self.e = T.nn.Parameter(T.randn(()))

            def forward(self, x):
                y = self.a + self.b * x + self.c * x ** 2 + self.d * x ** 3
                for exp in range(4, random.randint(4, 6)):
                    y = y + self.e * x ** exp
                return y

        random.seed(0)   # the same choice of orders, step by step, for both libraries
        x = T.linspace(-math.pi, math.pi, 2000)
        y = T.sin(x)
        model = set_start(T, DynamicNet())
        with T.no_grad():
            model.e.fill_(0.01)
        criterion = T.nn.MSELoss(reduction="sum")
        optimizer = T.optim.SGD(model.parameters(), lr=1e-8, momentum=0.9)
        losses = []
        for t in range(200):
            y_pred = model(x)
            loss = criterion(y_pred, y)
            if t % 100 == 99:
                losses.append(loss.item())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return T.tensor(losses), [q.detach() for q in model.parameters()]
    both(run, dtype="float32")
