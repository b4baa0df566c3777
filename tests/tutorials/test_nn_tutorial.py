"""pytorch/tutorials, beginner_source/nn_tutorial.py ("What is torch.nn really?") ported as
tests: logistic regression on MNIST written from scratch, then refactored step by step
onto F.cross_entropy, nn.Module / nn.Parameter, nn.Linear, optim, TensorDataset,
DataLoader with validation, fit() / get_data(), a CNN (F.avg_pool2d), nn.Sequential with
a Lambda layer (nn.AvgPool2d), a wrapped DataLoader with nn.AdaptiveAvgPool2d and a
device. Each stage runs with jitgrad and with torch on synthetic MNIST-shaped data
(flattened 784-pixel rows) from the same starting weights; the shuffled loaders get a
seeded Generator."""
import math

import numpy as np
import pytest
from conftest import both
from tutorial_data import image_arrays, seed_params

torch = pytest.importorskip("torch")

_x_train, _y_train = image_arrays(96, (28, 28), 10)
_x_valid, _y_valid = image_arrays(48, (28, 28), 11)
# MNIST's pixels are mostly 0 (mean about 0.13): dim the synthetic ones alike, or lr=0.5
# on 784 inputs overshoots
_x_train, _x_valid = _x_train * 0.2, _x_valid * 0.2
ARRAYS = (_x_train.reshape(96, 784), _y_train, _x_valid.reshape(48, 784), _y_valid)
START = np.random.default_rng(5).normal(size=(784, 10)).astype(np.float32)
bs, lr, epochs = 16, 0.5, 2


def data(T):
    return map(T.tensor, ARRAYS)


def start_weights(T):
    """The tutorial's `torch.randn(784, 10) / math.sqrt(784)`, given START's values."""
    w = T.randn(784, 10) / math.sqrt(784)
    w.copy_(T.tensor(START) / math.sqrt(784))
    return w


def test_from_scratch_and_functional():
    def run(T):
        x_train, y_train, x_valid, y_valid = data(T)
        n, c = x_train.shape
        weights = start_weights(T)
        weights.requires_grad_()
        bias = T.zeros(10, requires_grad=True)

        def log_softmax(x):
            return x - x.exp().sum(-1).log().unsqueeze(-1)

        def model(xb):
            return log_softmax(xb @ weights + bias)

        xb = x_train[0:bs]
        preds = model(xb)

        def nll(input, target):
            return -input[range(target.shape[0]), target].mean()
        loss_func = nll
        yb = y_train[0:bs]
        before = loss_func(preds, yb)

        def accuracy(out, yb):
            preds = T.argmax(out, dim=1)
            return (preds == yb).float().mean()
        acc_before = accuracy(preds, yb)
        for epoch in range(epochs):
            for i in range((n - 1) // bs + 1):
                start_i = i * bs
                end_i = start_i + bs
                xb = x_train[start_i:end_i]
                yb = y_train[start_i:end_i]
                pred = model(xb)
                loss = loss_func(pred, yb)
                loss.backward()
                with T.no_grad():
                    weights -= weights.grad * lr
                    bias -= bias.grad * lr
                    weights.grad.zero_()
                    bias.grad.zero_()
        after = loss_func(model(xb), yb), accuracy(model(xb), yb)
        F = T.nn.functional

        def model(xb):   # noqa: F811  (the tutorial redefines it)
            return xb @ weights + bias
        functional = F.cross_entropy(model(xb), yb), accuracy(model(xb), yb)
        return (n, c), preds[0], before, acc_before, after, functional, weights, bias
    both(run, dtype="float32")


def test_module_linear_and_optim():
    def run(T):
        nn, optim, F = T.nn, T.optim, T.nn.functional
        x_train, y_train, x_valid, y_valid = data(T)
        n = x_train.shape[0]
        loss_func = F.cross_entropy

        class Mnist_Logistic(nn.Module):
            def __init__(self):
                super().__init__()
                self.weights = nn.Parameter(start_weights(T))
                self.bias = nn.Parameter(T.zeros(10))

            def forward(self, xb):
                return xb @ self.weights + self.bias

        model = Mnist_Logistic()

        def fit():
            for epoch in range(epochs):
                for i in range((n - 1) // bs + 1):
                    start_i = i * bs
                    end_i = start_i + bs
                    xb = x_train[start_i:end_i]
                    yb = y_train[start_i:end_i]
                    pred = model(xb)
                    loss = loss_func(pred, yb)
                    loss.backward()
                    with T.no_grad():
                        for p in model.parameters():
                            p -= p.grad * lr
                        model.zero_grad()
        fit()
        xb, yb = x_train[-bs:], y_train[-bs:]
        results = [loss_func(model(xb), yb)]

        class Mnist_Logistic(nn.Module):   # noqa: F811  (the tutorial's refactor onto nn.Linear)
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(784, 10)

            def forward(self, xb):
                return self.lin(xb)
        model = seed_params(T, Mnist_Logistic())
        fit()
        results.append(loss_func(model(xb), yb))

        def get_model():
            model = seed_params(T, Mnist_Logistic())
            return model, optim.SGD(model.parameters(), lr=lr)
        model, opt = get_model()
        for epoch in range(epochs):
            for i in range((n - 1) // bs + 1):
                xb, yb = x_train[i * bs:i * bs + bs], y_train[i * bs:i * bs + bs]
                loss = loss_func(model(xb), yb)
                loss.backward()
                opt.step()
                opt.zero_grad()
        results.append(loss_func(model(xb), yb))
        train_ds = T.utils.data.TensorDataset(x_train, y_train)
        model, opt = get_model()
        for epoch in range(epochs):
            for i in range((n - 1) // bs + 1):
                xb, yb = train_ds[i * bs: i * bs + bs]
                loss = loss_func(model(xb), yb)
                loss.backward()
                opt.step()
                opt.zero_grad()
        results.append(loss_func(model(xb), yb))
        train_dl = T.utils.data.DataLoader(train_ds, batch_size=bs)
        model, opt = get_model()
        for epoch in range(epochs):
            for xb, yb in train_dl:
                loss = loss_func(model(xb), yb)
                loss.backward()
                opt.step()
                opt.zero_grad()
        results.append(loss_func(model(xb), yb))
        train_dl = T.utils.data.DataLoader(train_ds, batch_size=bs, shuffle=True,
                                           generator=T.Generator().manual_seed(0))
        valid_ds = T.utils.data.TensorDataset(x_valid, y_valid)
        valid_dl = T.utils.data.DataLoader(valid_ds, batch_size=bs * 2)
        model, opt = get_model()
        valid = []
        for epoch in range(epochs):
            model.train()
            for xb, yb in train_dl:
                loss = loss_func(model(xb), yb)
                loss.backward()
                opt.step()
                opt.zero_grad()
            model.eval()
            with T.no_grad():
                valid_loss = sum(loss_func(model(xb), yb) for xb, yb in valid_dl)
            valid.append(valid_loss / len(valid_dl))
        return results, valid, [p.detach() for p in model.parameters()]
    both(run, dtype="float32")


def loss_batch(model, loss_func, xb, yb, opt=None):
    loss = loss_func(model(xb), yb)
    if opt is not None:
        loss.backward()
        opt.step()
        opt.zero_grad()
    return loss.item(), len(xb)


def fit(T, epochs, model, loss_func, opt, train_dl, valid_dl):
    val_losses = []
    for epoch in range(epochs):
        model.train()
        for xb, yb in train_dl:
            loss_batch(model, loss_func, xb, yb, opt)
        model.eval()
        with T.no_grad():
            losses, nums = zip(*[loss_batch(model, loss_func, xb, yb) for xb, yb in valid_dl])
        val_losses.append(np.sum(np.multiply(losses, nums)) / np.sum(nums))
    return T.tensor(np.array(val_losses))   # (a list of numpy float64 scalars: see the report)


def get_data(T, train_ds, valid_ds, bs):
    return (T.utils.data.DataLoader(train_ds, batch_size=bs, shuffle=True, generator=T.Generator().manual_seed(1)),
            T.utils.data.DataLoader(valid_ds, batch_size=bs * 2))


class Wrapped:
    """The tutorial's WrappedDataLoader."""

    def __init__(self, dl, func):
        self.dl = dl
        self.func = func

    def __len__(self):
        return len(self.dl)

    def __iter__(self):
        for b in iter(self.dl):
            yield self.func(*b)


@pytest.mark.parametrize("stage", ["logistic", "cnn", "sequential", "adaptive"])
def test_fit_get_data_and_cnns(stage):
    def run(T):
        nn, optim, F = T.nn, T.optim, T.nn.functional
        x_train, y_train, x_valid, y_valid = data(T)
        train_ds = T.utils.data.TensorDataset(x_train, y_train)
        valid_ds = T.utils.data.TensorDataset(x_valid, y_valid)
        train_dl, valid_dl = get_data(T, train_ds, valid_ds, bs)
        loss_func = F.cross_entropy

        class Lambda(nn.Module):
            def __init__(self, func):
                super().__init__()
                self.func = func

            def forward(self, x):
                return self.func(x)

        def conv_layers():
            return [nn.Conv2d(1, 16, kernel_size=3, stride=2, padding=1), nn.ReLU(),
                    nn.Conv2d(16, 16, kernel_size=3, stride=2, padding=1), nn.ReLU(),
                    nn.Conv2d(16, 10, kernel_size=3, stride=2, padding=1), nn.ReLU()]

        if stage == "logistic":
            model = seed_params(T, nn.Linear(784, 10))
            opt = optim.SGD(model.parameters(), lr=lr)
        elif stage == "cnn":
            class Mnist_CNN(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv1 = nn.Conv2d(1, 16, kernel_size=3, stride=2, padding=1)
                    self.conv2 = nn.Conv2d(16, 16, kernel_size=3, stride=2, padding=1)
                    self.conv3 = nn.Conv2d(16, 10, kernel_size=3, stride=2, padding=1)

                def forward(self, xb):
                    xb = xb.view(-1, 1, 28, 28)
                    xb = F.relu(self.conv1(xb))
                    xb = F.relu(self.conv2(xb))
                    xb = F.relu(self.conv3(xb))
                    xb = F.avg_pool2d(xb, 4)
                    return xb.view(-1, xb.size(1))
            model = seed_params(T, Mnist_CNN())
            opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        elif stage == "sequential":
            model = seed_params(T, nn.Sequential(Lambda(lambda x: x.view(-1, 1, 28, 28)), *conv_layers(),
                                                 nn.AvgPool2d(4), Lambda(lambda x: x.view(x.size(0), -1))))
            opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        else:
            dev = T.device("cuda") if T.cuda.is_available() and T is torch else T.device("cpu")

            def preprocess(x, y):
                return x.view(-1, 1, 28, 28).to(dev), y.to(dev)
            train_dl, valid_dl = Wrapped(train_dl, preprocess), Wrapped(valid_dl, preprocess)
            model = seed_params(T, nn.Sequential(*conv_layers(), nn.AdaptiveAvgPool2d(1),
                                                 Lambda(lambda x: x.view(x.size(0), -1))))
            model.to(dev)
            opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        val = fit(T, epochs, model, loss_func, opt, train_dl, valid_dl)
        return val, [p.detach() for p in model.parameters()]
    both(run, dtype="float32")
