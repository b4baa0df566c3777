"""pytorch/tutorials, beginner_source/basics (Learn the Basics) ported as tests: each runs
the tutorial's code path with jitgrad and with torch, on synthetic data of the dataset's
shapes (tutorial_data.py), and the two must agree: shapes, dtypes, losses, accuracies,
trained weights. A shuffled DataLoader gets a seeded Generator, so both visit the
samples in the same order."""
import os

import numpy as np
import pytest
from conftest import both
from tutorial_data import fashion_mnist, seed_params, to_tensor

torch = pytest.importorskip("torch")


def neural_network(T):
    """The quickstart / buildmodel / optimization tutorials' model."""
    nn = T.nn

    class NeuralNetwork(nn.Module):
        def __init__(self):
            super().__init__()
            self.flatten = nn.Flatten()
            self.linear_relu_stack = nn.Sequential(
                nn.Linear(28 * 28, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

        def forward(self, x):
            x = self.flatten(x)
            return self.linear_relu_stack(x)
    return NeuralNetwork


def train_loop(T, dataloader, model, loss_fn, optimizer, device, log):
    size = len(dataloader.dataset)
    model.train()
    for batch, (X, y) in enumerate(dataloader):
        X, y = X.to(device), y.to(device)
        pred = model(X)
        loss = loss_fn(pred, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if batch % 2 == 0:
            loss, current = loss.item(), batch * dataloader.batch_size + len(X)
            log.append(f"loss: {loss:>7f}  [{current:>5d}/{size:>5d}]")


def test_loop(T, dataloader, model, loss_fn, device, log):
    model.eval()
    size = len(dataloader.dataset)
    num_batches = len(dataloader)
    test_loss, correct = 0, 0
    with T.no_grad():
        for X, y in dataloader:
            X, y = X.to(device), y.to(device)
            pred = model(X)
            test_loss += loss_fn(pred, y).item()
            correct += (pred.argmax(1) == y).type(T.float).sum().item()
    test_loss /= num_batches
    correct /= size
    log.append(f"Test Error: Accuracy: {(100 * correct):>0.1f}%, Avg loss: {test_loss:>8f}")
    return test_loss, correct


test_loop.__test__ = False  # a tutorial function, not a pytest test


def test_quickstart(tmp_path):
    def run(T):
        training_data = fashion_mnist(T, train=True, transform=to_tensor(T))
        test_data = fashion_mnist(T, train=False, transform=to_tensor(T))
        batch_size = 16
        train_dataloader = T.utils.data.DataLoader(training_data, batch_size=batch_size)
        test_dataloader = T.utils.data.DataLoader(test_data, batch_size=batch_size)
        for X, y in test_dataloader:
            shapes = (tuple(X.shape), tuple(y.shape), str(y.dtype))
            break
        device = "cuda" if T.cuda.is_available() and T is torch else "cpu"
        model = seed_params(T, neural_network(T)().to(device))
        loss_fn = T.nn.CrossEntropyLoss()
        optimizer = T.optim.SGD(model.parameters(), lr=1e-1)
        log, results = [], []
        for _ in range(2):
            train_loop(T, train_dataloader, model, loss_fn, optimizer, device, log)
            results.append(test_loop(T, test_dataloader, model, loss_fn, device, log))
        path = os.path.join(tmp_path, f"model-{T.__name__}.pth")
        T.save(model.state_dict(), path)
        model = neural_network(T)()
        model.load_state_dict(T.load(path, weights_only=True))
        model.eval()
        x, y = test_data[0][0], test_data[0][1]
        with T.no_grad():
            pred = model(x)
            predicted = int(pred[0].argmax(0))
        return shapes, T.tensor([r[0] for r in results]), [r[1] for r in results], predicted, y, \
            [p.detach() for p in model.parameters()]
    j, t = both(run, dtype="float32")
    assert j[1][1] < j[1][0]  # it learns


def test_data_tutorial():
    """Datasets & DataLoaders: indexing a dataset, a sample index from randint, a custom
    Dataset reading an annotations table, a shuffled DataLoader and next(iter(...))."""
    names = [f"img{i}.png" for i in range(10)]
    files = {name: np.random.default_rng(i).random((28, 28)).astype(np.float32) for i, name in enumerate(names)}
    annotations = [(name, i % 3) for i, name in enumerate(names)]

    def run(T):
        training_data = fashion_mnist(T, train=True, transform=to_tensor(T))
        sample_idx = T.randint(len(training_data), size=(1,)).item()
        img, label = training_data[sample_idx]
        first = (tuple(img.squeeze().shape), 0 <= sample_idx < len(training_data), type(label).__name__)

        class CustomImageDataset(T.utils.data.Dataset):
            def __init__(self, annotations_file, img_dir, transform=None, target_transform=None):
                self.img_labels = annotations_file
                self.img_dir = img_dir
                self.transform = transform
                self.target_transform = target_transform

            def __len__(self):
                return len(self.img_labels)

            def __getitem__(self, idx):
                img_path = os.path.join(self.img_dir, self.img_labels[idx][0])
                image = T.from_numpy(files[os.path.basename(img_path)])
                label = np.int64(self.img_labels[idx][1])   # pandas' iloc gives a numpy int
                if self.transform:
                    image = self.transform(image)
                if self.target_transform:
                    label = self.target_transform(label)
                return image, label

        custom = CustomImageDataset(annotations, "images", transform=lambda x: x.unsqueeze(0))
        loader = T.utils.data.DataLoader(custom, batch_size=4, shuffle=True, generator=T.Generator().manual_seed(0))
        train_features, train_labels = next(iter(loader))
        img = train_features[0].squeeze()
        train_dataloader = T.utils.data.DataLoader(training_data, batch_size=64, shuffle=True,
                                                   generator=T.Generator().manual_seed(1))
        feats, labels = next(iter(train_dataloader))
        return first, tuple(train_features.size()), train_labels, img, tuple(feats.shape), labels, feats[5]
    both(run, dtype="float32")


def test_transforms_tutorial_target_transform():
    """Transforms: ToTensor on the images, a Lambda one-hot target transform (the tutorial's
    scatter_ is written with indexing here: jitgrad has no scatter_)."""
    def run(T):
        def one_hot(y):
            out = T.zeros(10, dtype=T.float)
            out[y] = 1
            return out
        ds = fashion_mnist(T, transform=to_tensor(T), target_transform=one_hot)
        x, y = next(iter(T.utils.data.DataLoader(ds, batch_size=8)))
        return x.dtype == T.float32, tuple(x.shape), y
    both(run, dtype="float32")


def test_buildmodel_tutorial():
    def run(T):
        nn = T.nn
        device = "cpu"
        model = seed_params(T, neural_network(T)().to(device))
        X = T.tensor(np.random.default_rng(0).random((1, 28, 28)).astype(np.float32), device=device)
        logits = model(X)
        pred_probab = nn.Softmax(dim=1)(logits)
        y_pred = pred_probab.argmax(1)
        input_image = T.tensor(np.random.default_rng(1).random((3, 28, 28)).astype(np.float32))
        flat_image = nn.Flatten()(input_image)
        layer1 = seed_params(T, nn.Linear(in_features=28 * 28, out_features=20))
        hidden1 = nn.ReLU()(layer1(flat_image))
        seq_modules = nn.Sequential(nn.Flatten(), layer1, nn.ReLU(), seed_params(T, nn.Linear(20, 10), 1))
        logits2 = seq_modules(input_image)
        probs = nn.Softmax(dim=1)(logits2)
        named = [(name, tuple(param.size())) for name, param in model.named_parameters()]
        return logits, pred_probab, y_pred, tuple(flat_image.size()), hidden1, probs, named
    both(run, dtype="float32")


def test_autogradqs_tutorial():
    def run(T):
        x = T.ones(5)
        y = T.zeros(3)
        r = np.random.default_rng(0)
        w = T.tensor(r.normal(size=(5, 3)).astype(np.float32), requires_grad=True)
        b = T.tensor(r.normal(size=3).astype(np.float32), requires_grad=True)
        z = T.matmul(x, w) + b
        loss = T.nn.functional.binary_cross_entropy_with_logits(z, y)
        # (the tutorial also prints loss.grad_fn: torch's is BinaryCrossEntropyWithLogitsBackward0,
        # jitgrad composes the loss and ends on MeanBackward0; a difference left to the nn owner)
        names = type(z.grad_fn).__name__
        loss.backward()
        grads = w.grad, b.grad
        z = T.matmul(x, w) + b
        with T.no_grad():
            z2 = T.matmul(x, w) + b
        z_det = z.detach()
        inp = T.eye(4, 5, requires_grad=True)
        out = (inp + 1).pow(2).t()
        out.backward(T.ones_like(out), retain_graph=True)
        first = inp.grad.clone()
        out.backward(T.ones_like(out), retain_graph=True)
        second = inp.grad.clone()
        inp.grad.zero_()
        out.backward(T.ones_like(out), retain_graph=True)
        return names, grads, z.requires_grad, z2.requires_grad, z_det.requires_grad, first, second, inp.grad
    both(run, dtype="float32")


def test_optimization_tutorial():
    def run(T):
        training_data = fashion_mnist(T, train=True, transform=to_tensor(T))
        test_data = fashion_mnist(T, train=False, transform=to_tensor(T))
        train_dataloader = T.utils.data.DataLoader(training_data, batch_size=16, shuffle=True,
                                                   generator=T.Generator().manual_seed(3))
        test_dataloader = T.utils.data.DataLoader(test_data, batch_size=16)
        model = seed_params(T, neural_network(T)())
        learning_rate, epochs = 1e-1, 3
        loss_fn = T.nn.CrossEntropyLoss()
        optimizer = T.optim.SGD(model.parameters(), lr=learning_rate)
        log, results = [], []
        for _ in range(epochs):
            train_loop(T, train_dataloader, model, loss_fn, optimizer, "cpu", log)
            results.append(test_loop(T, test_dataloader, model, loss_fn, "cpu", log))
        return T.tensor([r[0] for r in results]), [r[1] for r in results], [p.detach() for p in model.parameters()]
    j, _ = both(run, dtype="float32")
    assert j[0][-1] < j[0][0]


def test_saveloadrun_tutorial(tmp_path):
    """Saving and loading weights (state_dict); the tutorial's torchvision vgg16 is the
    quickstart model here. (Saving a whole Module object pickles it: jitgrad.save writes
    tensors only, see the README.)"""
    def run(T):
        model = seed_params(T, neural_network(T)())
        path = os.path.join(tmp_path, f"model_weights-{T.__name__}.pth")
        T.save(model.state_dict(), path)
        model2 = neural_network(T)()
        model2.load_state_dict(T.load(path, weights_only=True))
        model2.eval()
        x = T.tensor(np.random.default_rng(0).random((2, 28, 28)).astype(np.float32))
        return model2(x), [k for k in model2.state_dict()]
    both(run, dtype="float32")


def test_tensorqs_tutorial():
    def run(T):
        data = [[1, 2], [3, 4]]
        x_data = T.tensor(data)
        np_array = np.array(data)
        x_np = T.from_numpy(np_array)
        x_ones = T.ones_like(x_data)
        shape = (2, 3)
        made = [T.ones(shape), T.zeros(shape), T.rand(shape).shape, T.rand_like(x_data, dtype=T.float).shape]
        tensor = T.ones(4, 4)
        attrs = (tuple(tensor.shape), str(tensor.dtype), str(tensor.device))
        tensor[:, 1] = 0
        rows = tensor[0], tensor[:, 0], tensor[..., -1]
        t1 = T.cat([tensor, tensor, tensor], dim=1)
        y1 = tensor @ tensor.T
        y2 = tensor.matmul(tensor.T)
        z1 = tensor * tensor
        z2 = tensor.mul(tensor)
        agg = tensor.sum()
        agg_item = agg.item()
        tensor.add_(5)
        t = T.ones(5)
        n = t.numpy()
        t.add_(1)
        shared = n.copy()
        n2 = np.ones(5)
        t2 = T.from_numpy(n2)
        np.add(n2, 1, out=n2)
        return x_data, x_np, x_ones, made, attrs, rows, t1, y1, y2, z1, z2, agg_item, tensor, shared.tolist(), t2
    both(run, dtype="float32")
