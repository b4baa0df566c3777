"""pytorch/tutorials, beginner_source/blitz (Deep Learning with PyTorch: A 60 Minute Blitz)
ported as tests: tensors, autograd, the LeNet-style network with a manual SGD step and
optim.SGD, and the CIFAR10 classifier (Conv2d, MaxPool2d, torch.flatten, CrossEntropyLoss,
SGD with momentum, a shuffled DataLoader of batch 4, torch.max over the outputs). Each runs
with jitgrad and with torch on the same synthetic data and starting weights."""
import numpy as np
import pytest
from conftest import both
from tutorial_data import cifar10, seed_params, to_tensor

torch = pytest.importorskip("torch")


def test_tensor_tutorial():
    def run(T):
        data = [[1, 2], [3, 4]]
        x_data = T.tensor(data)
        x_np = T.from_numpy(np.array(data))
        x = T.ones(5, 3, dtype=T.double)
        x_rand = T.rand_like(x, dtype=T.float)
        y = T.tensor(np.random.default_rng(0).random((5, 3)).astype(np.float32))
        s = x.float() + y
        result = T.empty(5, 3)
        T.add(x.float(), y, out=result) if T is torch else result.copy_(T.add(x.float(), y))
        y2 = y.clone()
        y2.add_(x.float())
        tensor = T.ones(4, 4)
        tensor[:, 1] = 0
        t1 = T.cat([tensor, tensor, tensor], dim=1)
        z = y.view(15)
        w = y.view(-1, 5)
        scalar = T.tensor([0.25]).item()
        a = T.ones(5)
        b = a.numpy()
        a.add_(1)
        c = np.ones(5)
        d = T.from_numpy(c)
        np.add(c, 1, out=c)
        return (x_data, x_np, tuple(x_rand.shape), str(x_rand.dtype), s, result, y2, t1, tuple(z.size()),
                tuple(w.size()), scalar, b.tolist(), d, tuple(y.size()))
    both(run, dtype="float32")


def test_autograd_tutorial():
    def run(T):
        a = T.tensor([2., 3.], requires_grad=True)
        b = T.tensor([6., 4.], requires_grad=True)
        Q = 3 * a ** 3 - b ** 2
        external_grad = T.tensor([1., 1.])
        Q.backward(gradient=external_grad)
        checks = ((9 * a ** 2 == a.grad).tolist(), (-2 * b == b.grad).tolist())
        x = T.rand(5, 5)
        y = T.rand(5, 5)
        z = T.rand((5, 5), requires_grad=True)
        flags = (x + y).requires_grad, (x + z).requires_grad
        class Backbone(T.nn.Module):   # the tutorial's resnet18, reduced to a feature layer and `fc`
            def __init__(self):
                super().__init__()
                self.features = T.nn.Linear(8, 4)
                self.fc = T.nn.Linear(4, 3)

            def forward(self, x):
                return self.fc(self.features(x).relu())
        model = Backbone()
        for param in model.parameters():
            param.requires_grad = False
        model.fc = seed_params(T, T.nn.Linear(4, 2))
        optimizer = T.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        return a.grad, b.grad, checks, flags, trainable, len(optimizer.param_groups[0]["params"])
    both(run, dtype="float32")


def lenet(T):
    nn, F = T.nn, T.nn.functional

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.fc1 = nn.Linear(16 * 5 * 5, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, 10)

        def forward(self, input):
            c1 = F.relu(self.conv1(input))
            s2 = F.max_pool2d(c1, (2, 2))
            c3 = F.relu(self.conv2(s2))
            s4 = F.max_pool2d(c3, 2)
            s4 = T.flatten(s4, 1)
            f5 = F.relu(self.fc1(s4))
            f6 = F.relu(self.fc2(f5))
            return self.fc3(f6)
    return Net


def test_neural_networks_tutorial():
    def run(T):
        net = seed_params(T, lenet(T)())
        params = list(net.parameters())
        r = np.random.default_rng(0)
        input = T.tensor(r.normal(size=(1, 1, 32, 32)).astype(np.float32))
        out = net(input)
        net.zero_grad()
        out.backward(T.tensor(r.normal(size=(1, 10)).astype(np.float32)))
        output = net(input)
        target = T.tensor(r.normal(size=10).astype(np.float32)).view(1, -1)
        criterion = T.nn.MSELoss()
        loss = criterion(output, target)
        # the tutorial prints loss.grad_fn and its next functions: torch's MSELoss node is
        # MseLossBackward0, jitgrad composes the loss and ends on MeanBackward0 (left to the nn
        # owner); the Linear node before it is compared
        linear = loss.grad_fn
        while type(linear).__name__ not in ("AddmmBackward0",):
            linear = next(f for f, _ in linear.next_functions if f is not None)
        chain = type(linear).__name__
        net.zero_grad()
        before = net.conv1.bias.grad
        loss.backward()
        after = net.conv1.bias.grad.clone()
        learning_rate = 0.01
        for f in net.parameters():
            f.data.sub_(f.grad.data * learning_rate)
        optimizer = T.optim.SGD(net.parameters(), lr=0.01)
        optimizer.zero_grad()
        output = net(input)
        loss2 = criterion(output, target)
        loss2.backward()
        optimizer.step()
        return (len(params), tuple(params[0].size()), out, loss, chain, before, after, loss2,
                [p.detach() for p in net.parameters()])
    both(run, dtype="float32")


def test_cifar10_tutorial():
    def run(T):
        nn, F = T.nn, T.nn.functional

        def transform(img):   # ToTensor, then Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
            return (to_tensor(T)(img) - 0.5) / 0.5
        batch_size = 4
        trainset = cifar10(T, train=True, transform=transform)
        trainloader = T.utils.data.DataLoader(trainset, batch_size=batch_size, shuffle=True, num_workers=2,
                                              generator=T.Generator().manual_seed(0))
        testset = cifar10(T, train=False, transform=transform)
        testloader = T.utils.data.DataLoader(testset, batch_size=batch_size, shuffle=False, num_workers=2)
        classes = ("plane", "car", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
        images, labels = next(iter(trainloader))
        first = (tuple(images.shape), " ".join(f"{classes[labels[j]]:5s}" for j in range(batch_size)))

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(3, 6, 5)
                self.pool = nn.MaxPool2d(2, 2)
                self.conv2 = nn.Conv2d(6, 16, 5)
                self.fc1 = nn.Linear(16 * 5 * 5, 120)
                self.fc2 = nn.Linear(120, 84)
                self.fc3 = nn.Linear(84, 10)

            def forward(self, x):
                x = self.pool(F.relu(self.conv1(x)))
                x = self.pool(F.relu(self.conv2(x)))
                x = T.flatten(x, 1)
                x = F.relu(self.fc1(x))
                x = F.relu(self.fc2(x))
                return self.fc3(x)

        net = seed_params(T, Net())
        criterion = nn.CrossEntropyLoss()
        optimizer = T.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        losses = []
        for epoch in range(2):
            running_loss = 0.0
            for i, data in enumerate(trainloader, 0):
                inputs, labels = data
                optimizer.zero_grad()
                outputs = net(inputs)
                loss = criterion(outputs, labels)
                loss.backward()
                optimizer.step()
                running_loss += loss.item()
                if i % 5 == 4:
                    losses.append(running_loss / 5)
                    running_loss = 0.0
        correct = total = 0
        correct_pred = {classname: 0 for classname in classes}
        with T.no_grad():
            for data in testloader:
                images, labels = data
                outputs = net(images)
                _, predicted = T.max(outputs.data, 1)
                total += labels.size(0)
                correct += (predicted == labels).sum().item()
                for label, prediction in zip(labels, predicted):
                    if label == prediction:
                        correct_pred[classes[label]] += 1
        return first, T.tensor(losses), correct, total, correct_pred, [p.detach() for p in net.parameters()]
    both(run, dtype="float32")
