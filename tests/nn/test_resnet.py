"""A ResNet-18 with torchvision's architecture (written here, no pretrained weights) built
from the same code with jitgrad and with torch, with torch's initial weights copied over:
one SGD step (train mode: batch norm's batch statistics and running statistics) must give
the same loss, gradients, parameters and buffers in float64, and then eval() the same
logits (the running statistics normalise)."""
import numpy as np
import pytest
from conftest import assert_close

import jitgrad

torch = pytest.importorskip("torch")


def resnet18(T, num_classes=10):
    nn = T.nn

    def conv3x3(cin, cout, stride=1):
        return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False, dtype=T.float64)

    def bn(c):
        return nn.BatchNorm2d(c, dtype=T.float64)

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride=1, downsample=None):
            super().__init__()
            self.conv1, self.bn1 = conv3x3(cin, cout, stride), bn(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2, self.bn2 = conv3x3(cout, cout), bn(cout)
            self.downsample = downsample

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False, dtype=T.float64)
            self.bn1 = bn(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
            self.layer1 = self._make_layer(64, 2)
            self.layer2 = self._make_layer(128, 2, stride=2)
            self.layer3 = self._make_layer(256, 2, stride=2)
            self.layer4 = self._make_layer(512, 2, stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512, num_classes, dtype=T.float64)

        def _make_layer(self, planes, blocks, stride=1):
            down = None
            if stride != 1 or self.inplanes != planes:
                down = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride=stride, bias=False, dtype=T.float64),
                                     bn(planes))
            layers = [BasicBlock(self.inplanes, planes, stride, down)]
            self.inplanes = planes
            layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
            return nn.Sequential(*layers)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(T.flatten(self.avgpool(x), 1))

    return ResNet()


def _state(m):
    return {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}


def test_resnet18_sgd_step_and_eval_match_torch():
    torch.manual_seed(0)
    tm = resnet18(torch)
    jm = resnet18(jitgrad)
    jm.load_state_dict({k: jitgrad.tensor(v) for k, v in _state(tm).items()})
    r = np.random.default_rng(0)
    x = r.normal(size=(4, 3, 32, 32))
    y = np.array([1, 7, 3, 1])
    logits_eval = {}
    for T, m in ((torch, tm), (jitgrad, jm)):
        opt = T.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        opt.zero_grad()
        out = m(T.tensor(x))
        loss = T.nn.functional.cross_entropy(out, T.tensor(y))
        loss.backward()
        m.grads = {n: p.grad.numpy().copy() for n, p in m.named_parameters()}
        m.loss = loss.item()
        m.node = type(out.grad_fn).__name__
        opt.step()
        m.eval()
        with T.no_grad():
            logits_eval[T.__name__] = m(T.tensor(x[:2])).numpy()
    assert_close(jm.loss, tm.loss, msg="loss")
    assert set(jm.grads) == set(tm.grads)
    for n in tm.grads:
        assert_close(jm.grads[n], tm.grads[n], rtol=1e-7, atol=1e-9, msg=n)
    js, ts = _state(jm), _state(tm)
    assert set(js) == set(ts)
    for k in ts:
        assert_close(js[k], ts[k], rtol=1e-7, atol=1e-9, msg=k)
    assert_close(logits_eval["jitgrad"], logits_eval["torch"], rtol=1e-7, atol=1e-9, msg="eval logits")


def test_resnet18_graph_has_torch_nodes():
    """The nodes along the graph are torch's: BatchNorm, pooling and convolution included."""
    def names(T, m):
        out = m(T.ones(2, 3, 32, 32, dtype=T.float64))
        seen, stack = set(), [out.grad_fn]
        while stack:
            f = stack.pop()
            if f is None or type(f).__name__ in seen:
                continue
            seen.add(type(f).__name__)
            stack.extend(g for g, _ in f.next_functions)
        return seen
    torch.manual_seed(1)
    assert names(jitgrad, resnet18(jitgrad)) == names(torch, resnet18(torch))
