"""Batch norm (training, running statistics, eval), group norm and the average poolings on
CUDA tensors against the same modules on the CPU, forward and backward, in float64."""
import numpy as np

import jitgrad


def _model(device):
    jitgrad.manual_seed(0)
    nn = jitgrad.nn
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, dtype=jitgrad.float64), nn.BatchNorm2d(4, dtype=jitgrad.float64),
                         nn.ReLU(), nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                         nn.GroupNorm(2, 4, dtype=jitgrad.float64), nn.AdaptiveAvgPool2d((2, 3)),
                         nn.Flatten(), nn.BatchNorm1d(24, momentum=None, dtype=jitgrad.float64)).to(device)


def test_modules_on_the_device_as_on_the_host():
    r = np.random.default_rng(0)
    xs = [r.normal(size=(3, 3, 7, 6)) for _ in range(3)]
    results = {}
    for device in ("cpu", "cuda"):
        m = _model(device)
        got = []
        for k, x in enumerate(xs):
            if k == 2:
                m.eval()
            xt = jitgrad.tensor(x, device=device, requires_grad=True)
            y = m(xt)
            (y * y).sum().backward()
            got.append([y.detach().cpu().numpy(), xt.grad.cpu().numpy()])
        got.append([p.grad.cpu().numpy() for p in m.parameters()])
        got.append([b.cpu().numpy() for b in m.buffers()])
        results[device] = got
    for k, (host, dev) in enumerate(zip(results["cpu"], results["cuda"])):
        for j, (a, b) in enumerate(zip(host, dev)):
            np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12, err_msg=f"{k}.{j}")
