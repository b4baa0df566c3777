"""pytorch/tutorials' autograd tutorials ported as tests, each run top to bottom with jitgrad
and with torch: intermediate_source/forward_ad_usage.py,
autograd_saved_tensors_hooks_tutorial.py, custom_function_conv_bn_tutorial.py and
advanced_source/numpy_extensions_tutorial.py.

Offline edits only: MNIST is synthetic images of its shape (tutorial_data), CPU instead of
CUDA (the conv-bn tutorial's CUDA peak memory is measured with tracemalloc, which sees
jitgrad's numpy buffers), fewer and smaller batches. The random draws differ between the
libraries, so each randn'd tensor is overwritten with the same values (`same`) and the
results are compared where the tutorial computes something."""
import functools
import importlib
import math
import os
import tempfile
import tracemalloc
import uuid

import numpy as np
import pytest
from conftest import assert_close, to_np
from numba.core.config import DISABLE_JIT
from tutorial_data import image_arrays

import jitgrad

torch = pytest.importorskip("torch")
LIBS = [torch, jitgrad]


@pytest.fixture(autouse=True)
def torch_one_thread():
    """torch's intra-op threads fight over CI's two cores (its slow-mode gradcheck ran 100x
    slower); one thread for these tests, restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def same(T, t, rng, scale=1.0):
    """t (a randn'd tensor) overwritten with draws from rng, the same for both libraries."""
    with T.no_grad():
        t.copy_(T.tensor(scale * rng.standard_normal(tuple(t.shape)), dtype=t.dtype))
    return t


def same_params(T, model, seed):
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        same(T, p, rng, 0.1)
    return model


def both(run):
    """run(T) for torch and jitgrad; their results (dicts of tensors/numbers) must agree."""
    t, j = run(torch), run(jitgrad)
    assert t.keys() == j.keys()
    for k in t:
        assert_close(to_np(j[k]), to_np(t[k]), rtol=1e-5, atol=1e-6, msg=k)
    return j, t


# ============================================================================ forward_ad_usage
def forward_ad_usage(T):
    fwAD = importlib.import_module(T.__name__ + ".autograd.forward_ad")
    nn = T.nn
    r = np.random.default_rng(0)
    res = {}
    primal = same(T, T.randn(10, 10), r)
    tangent = same(T, T.randn(10, 10), r)

    def fn(x, y):
        return x ** 2 + y ** 2

    with fwAD.dual_level():
        dual_input = fwAD.make_dual(primal, tangent)
        assert fwAD.unpack_dual(dual_input).tangent is tangent
        dual_input_alt = fwAD.make_dual(primal, tangent.T)
        assert fwAD.unpack_dual(dual_input_alt).tangent is not tangent
        plain_tensor = same(T, T.randn(10, 10), r)
        dual_output = fn(dual_input, plain_tensor)
        jvp = fwAD.unpack_dual(dual_output).tangent
    assert fwAD.unpack_dual(dual_output).tangent is None
    res["basic"] = jvp

    # Usage with Modules
    model = same_params(T, nn.Linear(5, 5), 1)
    input = same(T, T.randn(16, 5), r)
    params = {name: p for name, p in model.named_parameters()}
    tangents = {name: same(T, T.rand_like(p), r) for name, p in params.items()}
    with fwAD.dual_level():
        for name, p in params.items():
            delattr(model, name)
            setattr(model, name, fwAD.make_dual(p, tangents[name]))
        out = model(input)
        jvp = fwAD.unpack_dual(out).tangent
    res["module"] = jvp

    # Using the functional Module API
    from importlib import import_module
    functional_call = import_module(T.__name__ + ".func").functional_call
    model = nn.Linear(5, 5)
    dual_params = {}
    with fwAD.dual_level():
        for name, p in params.items():
            dual_params[name] = fwAD.make_dual(p, tangents[name])
        out = functional_call(model, dual_params, input)
        jvp2 = fwAD.unpack_dual(out).tangent
    assert T.allclose(jvp, jvp2)
    res["functional_call"] = jvp2

    # Custom autograd Function
    class Fn(T.autograd.Function):
        @staticmethod
        def forward(ctx, foo):
            result = T.exp(foo)
            ctx.result = result
            return result

        @staticmethod
        def jvp(ctx, gI):
            gO = gI * ctx.result
            del ctx.result
            return gO

    fn = Fn.apply
    primal = same(T, T.randn(10, 10, dtype=T.double, requires_grad=True), r)
    tangent = same(T, T.randn(10, 10), r)
    with fwAD.dual_level():
        dual_input = fwAD.make_dual(primal, tangent)
        dual_output = fn(dual_input)
        jvp = fwAD.unpack_dual(dual_output).tangent
    res["custom_function"] = jvp
    assert T.autograd.gradcheck(Fn.apply, (primal,), check_forward_ad=True, check_backward_ad=False,
                                check_undefined_grad=False, check_batched_grad=False)

    # Functional API: functorch's jvp is torch.func's, and make_functional_with_buffers is
    # functorch's own (a separate package; jitgrad has no `functorch` module): see ft() below
    ft = functorch_like(T)
    primal0, tangent0, primal1, tangent1 = (same(T, T.randn(10, 10), r) for _ in range(4))

    def fn(x, y):
        return x ** 2 + y ** 2

    primal_out, tangent_out = ft.jvp(fn, (primal0, primal1), (tangent0, tangent1))
    res["ft_jvp"], res["ft_jvp_primal"] = tangent_out, primal_out
    primal, tangent, y = (same(T, T.randn(10, 10), r) for _ in range(3))
    new_fn = functools.partial(fn, y=y)
    primal_out, tangent_out = ft.jvp(new_fn, (primal,), (tangent,))
    res["ft_partial"] = tangent_out

    # Using the functional API with Modules
    model = same_params(T, nn.Linear(5, 5), 2)
    input = same(T, T.randn(16, 5), r)
    tangents = tuple([same(T, T.rand_like(p), r) for p in model.parameters()])
    func, params, buffers = ft.make_functional_with_buffers(model)

    def func_params_only(params):
        return func(params, buffers, input)

    model_output, jvp_out = ft.jvp(func_params_only, (params,), (tangents,))
    res["ft_module"], res["ft_module_out"] = jvp_out, model_output
    return res


def functorch_like(T):
    """The tutorial's `import functorch as ft`. torch's is the functorch package; for jitgrad
    jvp is torch.func's and make_functional_with_buffers (functorch-only, deprecated there)
    is written here from functional_call, as functorch's docs describe it."""
    if T is torch:
        import functorch
        return functorch

    class ft:
        jvp = staticmethod(T.func.jvp)

        @staticmethod
        def make_functional_with_buffers(model):
            pnames = [n for n, _ in model.named_parameters()]
            bnames = [n for n, _ in model.named_buffers()]
            params = tuple(p.detach() for p in model.parameters())
            buffers = tuple(b for b in model.buffers())

            def func(params, buffers, *args, **kwargs):
                state = dict(zip(pnames, params))
                state.update(zip(bnames, buffers))
                return T.func.functional_call(model, state, args, kwargs)
            return func, params, buffers
    return ft


def test_forward_ad_usage():
    both(forward_ad_usage)


# ============================================================ autograd_saved_tensors_hooks
def saved_tensors_hooks(T, capsys=None):
    nn = T.nn
    r = np.random.default_rng(1)
    res = {}
    seen = []

    a = same(T, T.randn(5, requires_grad=True), r)
    b = T.ones(5, requires_grad=True)
    y = a * b
    print(y.grad_fn._saved_self)
    print(y.grad_fn._saved_other)

    def f(x):
        return x * x

    x = same(T, T.randn(5, requires_grad=True), r)
    y = f(f(f(x)))

    a = same(T, T.randn(5, requires_grad=True), r)
    b = T.ones(5, requires_grad=True)
    y = a * b
    assert y.grad_fn._saved_self is a
    assert y.grad_fn._saved_other is b

    a = same(T, T.randn(5, requires_grad=True), r)
    y = T.exp(a)
    assert y.grad_fn._saved_result.equal(y)
    assert y.grad_fn._saved_result is not y

    # Saved tensors hooks: the hooks see the tensors torch gives them
    def pack_hook(x):
        print("Packing", x)
        seen.append(("pack", to_np(x).tolist()))
        return x

    def unpack_hook(x):
        print("Unpacking", x)
        seen.append(("unpack", to_np(x).tolist()))
        return x
    a = T.ones(5, requires_grad=True)
    b = T.ones(5, requires_grad=True) * 2
    with T.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook):
        y = a * b
    y.sum().backward()
    res["hooks_a_grad"] = a.grad

    x = same(T, T.randn(5, requires_grad=True), r)
    with T.autograd.graph.saved_tensors_hooks(lambda x: x * 4, lambda x: x / 4):
        y = T.pow(x, 2)
    y.sum().backward()
    assert x.grad.equal(2 * x)
    res["scaled"] = x.grad

    # Returning an int
    storage = []

    def pack(x):
        storage.append(x)
        return len(storage) - 1

    def unpack(x):
        return storage[x]

    x = same(T, T.randn(5, requires_grad=True), r)
    with T.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = x * x
    y.sum().backward()
    assert x.grad.equal(2 * x)
    res["int"] = x.grad

    # Returning a tuple
    def pack(x):
        delta = same(T, T.randn(*x.size()), r)
        return x - delta, lambda x: x + delta

    def unpack(packed):
        x, f = packed
        return f(x)

    x = same(T, T.randn(5, requires_grad=True), r)
    with T.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = x * x
    y.sum().backward()
    assert T.allclose(x.grad, 2 * x)
    res["tuple"] = x.grad

    # Returning a str: the repr is evaluated back in the library's namespace
    x = same(T, T.randn(5, requires_grad=True), r)
    with T.autograd.graph.saved_tensors_hooks(lambda x: repr(x), lambda x: eval("T." + x, {"T": T})):
        y = x * x
    y.sum().backward()
    assert T.all(x.grad - 2 * x <= 1e-4)

    # Saving tensors to CPU
    def pack_hook(x):
        return (x.device, x.cpu())

    def unpack_hook(packed):
        device, tensor = packed
        return tensor.to(device)

    x = same(T, T.randn(5, requires_grad=True), r)
    with T.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = x * x
    y.sum().backward()
    assert T.allclose(x.grad, (2 * x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(T.randn(5))

        def forward(self, x):
            with T.autograd.graph.save_on_cpu(pin_memory=True):
                return self.w * x

    x = same(T, T.randn(5), r)
    model = same_params(T, Model(), 3)
    loss = model(x).sum()
    loss.backward()
    res["save_on_cpu"] = model.w.grad

    class SaveToCpu(nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args, **kwargs):
            with T.autograd.graph.save_on_cpu(pin_memory=True):
                return self.module(*args, **kwargs)

    model = same_params(T, nn.Sequential(nn.Linear(10, 100), SaveToCpu(nn.Linear(100, 100)), nn.Linear(100, 10)), 4)
    x = same(T, T.randn(10), r)
    loss = model(x).sum()
    loss.backward()
    res["save_to_cpu_module"] = model[1].module.weight.grad

    # Saving tensors to disk
    tmp_dir_obj = tempfile.TemporaryDirectory()
    tmp_dir = tmp_dir_obj.name

    def pack_hook(tensor):
        name = os.path.join(tmp_dir, str(uuid.uuid4()))
        T.save(tensor, name)
        return name

    def unpack_hook(name):
        tensor = T.load(name)
        os.remove(name)
        return tensor

    x = T.ones(5, requires_grad=True)
    with T.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook):
        y = x.pow(2)
    print(y.grad_fn._saved_self)
    try:
        print(y.grad_fn._saved_self)
        print("Double access succeeded!")
        res["double_access"] = 1
    except Exception:
        print("Double access failed!")
        res["double_access"] = 0

    class SelfDeletingTempFile():
        def __init__(self):
            self.name = os.path.join(tmp_dir, str(uuid.uuid4()))

        def __del__(self):
            os.remove(self.name)

    def pack_hook(tensor):
        temp_file = SelfDeletingTempFile()
        T.save(tensor, temp_file.name)
        return temp_file

    def unpack_hook(temp_file):
        return T.load(temp_file.name)

    x = same(T, T.randn(50, requires_grad=True), r)
    with T.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook):
        y = x.pow(2)
    assert len(os.listdir(tmp_dir)) == 1
    y.sum().backward()
    del y
    assert os.listdir(tmp_dir) == []      # the packed file is released with the graph
    res["disk"] = x.grad

    SAVE_ON_DISK_THRESHOLD = 1000

    def pack_hook(x):
        if x.numel() < SAVE_ON_DISK_THRESHOLD:
            return x
        temp_file = SelfDeletingTempFile()
        T.save(x, temp_file.name)    # the tutorial's `tensor` here is a typo for x
        return temp_file

    def unpack_hook(tensor_or_sctf):
        if isinstance(tensor_or_sctf, T.Tensor):
            return tensor_or_sctf
        return T.load(tensor_or_sctf.name)

    class SaveToDisk(nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args, **kwargs):
            with T.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook):
                return self.module(*args, **kwargs)

    # nn.DataParallel(SaveToDisk(Model())): until nn.DataParallel lands, the module itself
    # (on one device DataParallel calls it)
    net = SaveToDisk(same_params(T, nn.Linear(40, 30), 5))
    x = same(T, T.randn(8, 40), r)
    net(x).pow(2).sum().backward()
    res["save_to_disk"] = net.module.weight.grad
    del net
    tmp_dir_obj.cleanup()
    # what the hooks were given (the order differs: torch packs and unpacks mul's `other`
    # before its `self`, jitgrad `self` first)
    seen = sorted(seen)
    res["seen"] = T.tensor([v for kind, vals in seen for v in vals])
    res["seen_kinds"] = T.tensor([kind == "pack" for kind, _ in seen], dtype=T.float64)
    return res


def test_saved_tensors_hooks(capsys):
    both(saved_tensors_hooks)
    out = capsys.readouterr().out
    assert out.count("Packing") == 4 and out.count("Unpacking") == 4     # two libraries, two each
    assert out.count("Double access failed!") == 2


# ============================================================ custom_function_conv_bn_tutorial
def conv_bn_functions(T):
    F = T.nn.functional
    once_differentiable = importlib.import_module(T.__name__ + ".autograd.function").once_differentiable

    def convolution_backward(grad_out, X, weight):
        grad_input = F.conv2d(X.transpose(0, 1), grad_out.transpose(0, 1)).transpose(0, 1)
        grad_X = F.conv_transpose2d(grad_out, weight)
        return grad_X, grad_input

    class Conv2D(T.autograd.Function):
        @staticmethod
        def forward(ctx, X, weight):
            ctx.save_for_backward(X, weight)
            return F.conv2d(X, weight)

        @staticmethod
        @once_differentiable
        def backward(ctx, grad_out):
            X, weight = ctx.saved_tensors
            return convolution_backward(grad_out, X, weight)

    def unsqueeze_all(t):
        return t[None, :, None, None]

    def batch_norm_backward(grad_out, X, sum, sqrt_var, N, eps):
        tmp = -((X - unsqueeze_all(sum) / N) * grad_out).sum(dim=(0, 2, 3))
        d_denom = tmp / (sqrt_var + eps)**2
        d_var = d_denom / (2 * sqrt_var)
        d_mean_dx = grad_out / unsqueeze_all(sqrt_var + eps)
        d_mean_dx = unsqueeze_all(-d_mean_dx.sum(dim=(0, 2, 3)) / N)
        grad_input = X * unsqueeze_all(d_var * N)
        grad_input += unsqueeze_all(-d_var * sum)
        grad_input *= 2 / ((N - 1) * N)
        grad_input += d_mean_dx
        grad_input *= unsqueeze_all(sqrt_var + eps)
        grad_input += grad_out
        grad_input /= unsqueeze_all(sqrt_var + eps)
        return grad_input

    class BatchNorm(T.autograd.Function):
        @staticmethod
        def forward(ctx, X, eps=1e-3):
            sum = X.sum(dim=(0, 2, 3))
            var = X.var(unbiased=True, dim=(0, 2, 3))
            N = X.numel() / X.size(1)
            sqrt_var = T.sqrt(var)
            ctx.save_for_backward(X)
            ctx.eps = eps
            ctx.sum = sum
            ctx.N = N
            ctx.sqrt_var = sqrt_var
            mean = sum / N
            denom = sqrt_var + eps
            return (X - unsqueeze_all(mean)) / unsqueeze_all(denom)

        @staticmethod
        @once_differentiable
        def backward(ctx, grad_out):
            X, = ctx.saved_tensors
            return batch_norm_backward(grad_out, X, ctx.sum, ctx.sqrt_var, ctx.N, ctx.eps)

    class FusedConvBN2DFunction(T.autograd.Function):
        @staticmethod
        def forward(ctx, X, conv_weight, eps=1e-3):
            assert X.ndim == 4
            ctx.save_for_backward(X, conv_weight)
            X = F.conv2d(X, conv_weight)
            sum = X.sum(dim=(0, 2, 3))
            var = X.var(unbiased=True, dim=(0, 2, 3))
            N = X.numel() / X.size(1)
            sqrt_var = T.sqrt(var)
            ctx.eps = eps
            ctx.sum = sum
            ctx.N = N
            ctx.sqrt_var = sqrt_var
            mean = sum / N
            denom = sqrt_var + eps
            out = X - unsqueeze_all(mean)
            out /= unsqueeze_all(denom)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            X, conv_weight, = ctx.saved_tensors
            X_conv_out = F.conv2d(X, conv_weight)
            grad_out = batch_norm_backward(grad_out, X_conv_out, ctx.sum, ctx.sqrt_var, ctx.N, ctx.eps)
            grad_X, grad_input = convolution_backward(grad_out, X, conv_weight)
            return grad_X, grad_input, None, None, None, None, None

    return Conv2D, BatchNorm, FusedConvBN2DFunction


def conv_bn_gradchecks(T):
    Conv2D, BatchNorm, FusedConvBN2DFunction = conv_bn_functions(T)
    r = np.random.default_rng(2)
    res = {}
    weight = T.tensor(r.random((5, 3, 3, 3)), requires_grad=True)
    # the tutorial's X is (10, 3, 7, 7): slow-mode gradcheck's 1250 backward calls, too slow for CI
    X = T.tensor(r.random((2, 3, 5, 5)), requires_grad=True)
    assert T.autograd.gradcheck(Conv2D.apply, (X, weight))
    res["conv"] = Conv2D.apply(X, weight)
    res["conv_grads"] = T.cat([g.reshape(-1) for g in T.autograd.grad(res["conv"].pow(2).sum(), (X, weight))])
    a = T.tensor(r.random((1, 2, 3, 4)), requires_grad=True)
    assert T.autograd.gradcheck(BatchNorm.apply, (a,), fast_mode=False)
    res["bn"] = BatchNorm.apply(a)
    weight = T.tensor(r.random((5, 3, 3, 3)), requires_grad=True)
    X = T.tensor(r.random((2, 3, 4, 4)), requires_grad=True)
    assert T.autograd.gradcheck(FusedConvBN2DFunction.apply, (X, weight))
    out = FusedConvBN2DFunction.apply(X, weight)
    res["fused"] = out
    res["fused_grads"] = T.cat([g.reshape(-1) for g in T.autograd.grad(out.pow(3).sum(), (X, weight))])
    return res


def test_conv_bn_gradchecks():
    both(conv_bn_gradchecks)


def SameDropout(T, p):
    """nn.Dropout(p) whose masks come from a numpy stream, the same for both libraries."""
    rng = np.random.default_rng(8)

    class SameDropout(T.nn.Module):
        def forward(self, x):
            if not self.training:
                return x
            return x * T.tensor(rng.random(tuple(x.shape)) >= p, dtype=x.dtype) / (1 - p)
    return SameDropout()


def conv_bn_training(T, fused, log, peaks=None, epochs=2):
    """The tutorial's training: Net(fused) on synthetic MNIST-shaped images, 2 epochs of
    Adadelta with StepLR, a test pass each; the losses and test results are logged."""
    nn, F = T.nn, T.nn.functional
    _, _, FusedConvBN2DFunction = conv_bn_functions(T)

    class FusedConvBN(nn.Module):
        def __init__(self, in_channels, out_channels, kernel_size, exp_avg_factor=0.1, eps=1e-3, device=None,
                     dtype=None):
            super(FusedConvBN, self).__init__()
            factory_kwargs = {'device': device, 'dtype': dtype}
            weight_shape = (out_channels, in_channels, kernel_size, kernel_size)
            self.conv_weight = nn.Parameter(T.empty(*weight_shape, **factory_kwargs))
            self.num_features = out_channels
            self.eps = eps
            self.reset_parameters()

        def forward(self, X):
            return FusedConvBN2DFunction.apply(X, self.conv_weight, self.eps)

        def reset_parameters(self):
            nn.init.kaiming_uniform_(self.conv_weight, a=math.sqrt(5))

    class Net(nn.Module):
        def __init__(self, fused=True):
            super(Net, self).__init__()
            self.fused = fused
            if fused:
                self.convbn1 = FusedConvBN(1, 32, 3)
                self.convbn2 = FusedConvBN(32, 64, 3)
            else:
                self.conv1 = nn.Conv2d(1, 32, 3, 1, bias=False)
                self.bn1 = nn.BatchNorm2d(32, affine=False, track_running_stats=False)
                self.conv2 = nn.Conv2d(32, 64, 3, 1, bias=False)
                self.bn2 = nn.BatchNorm2d(64, affine=False, track_running_stats=False)
            self.fc1 = nn.Linear(9216, 128)
            self.dropout = nn.Dropout(0.5)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x):
            x = self.convbn1(x) if self.fused else self.bn1(self.conv1(x))
            x = F.relu(x)
            x = self.convbn2(x) if self.fused else self.bn2(self.conv2(x))
            x = F.relu(x)
            x = F.max_pool2d(x, 2)
            x = F.relu(x)
            x = x.flatten(1)
            x = self.fc1(x)
            x = self.dropout(x)
            x = F.relu(x)
            x = self.fc2(x)
            return F.log_softmax(x, dim=1)

    def train(model, device, train_loader, optimizer, epoch):
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            if tracemalloc.is_tracing():     # the tutorial's peak memory, on CPU: see test_conv_bn_peak_memory
                base = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
            output = model(data)
            loss = F.nll_loss(output, target)
            if tracemalloc.is_tracing():
                held = tracemalloc.get_traced_memory()[0] - base    # what the graph keeps for backward
            loss.backward()
            if tracemalloc.is_tracing():
                peaks.append((held, tracemalloc.get_traced_memory()[1] - base))
            optimizer.step()
            log.append(loss.item())

    def test(model, device, test_loader):
        model.eval()
        test_loss = 0
        correct = 0
        with T.inference_mode():
            for data, target in test_loader:
                data, target = data.to(device), target.to(device)
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction='sum').item()
                pred = output.argmax(dim=1, keepdim=True)
                correct += pred.eq(target.view_as(pred)).sum().item()
        log.append(test_loss / len(test_loader.dataset))
        log.append(correct)

    device = T.device("cpu")
    # MNIST's shape and normalisation; batches of 4 (the tutorial's 2048 is for a GPU)
    images, labels = image_arrays(12, (28, 28), seed=3)
    norm = (images[:, None] - 0.1307) / 0.3081
    ds = T.utils.data.TensorDataset(T.tensor(norm), T.tensor(labels))
    train_loader = T.utils.data.DataLoader(T.utils.data.Subset(ds, range(8)), batch_size=4)
    test_loader = T.utils.data.DataLoader(T.utils.data.Subset(ds, range(8, 12)), batch_size=4)

    T.manual_seed(123456)
    model = Net(fused=fused).to(device)
    model.dropout = SameDropout(T, 0.5)     # until manual_seed draws torch's numbers: the same masks
    convs = [model.convbn1.conv_weight, model.convbn2.conv_weight] if fused else [model.conv1.weight,
                                                                                  model.conv2.weight]
    rng = np.random.default_rng(4)
    for p in convs + list(model.fc1.parameters()) + list(model.fc2.parameters()):
        same(T, p, rng, 0.05)
    optimizer = T.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = T.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(epochs):
        train(model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()
    return model


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_conv_bn_training(fused):
    logs = {}
    epochs = 1 if DISABLE_JIT else 2     # without the JIT, one epoch keeps the CI pass short
    for T in LIBS:
        logs[T] = []
        conv_bn_training(T, fused, logs[T], epochs=epochs)
    assert len(logs[jitgrad]) == epochs * (2 + 2)        # per epoch: 2 training losses, test loss, correct
    # float32 over two epochs of Adadelta at lr=1: the last digits drift apart
    np.testing.assert_allclose(logs[jitgrad], logs[torch], rtol=2e-3, atol=1e-4)


@pytest.mark.skipif(DISABLE_JIT, reason="without the JIT the engine's loops run in Python and tracemalloc traces "
                    "them allocation by allocation (minutes); the buffers measured are the same compiled")
def test_conv_bn_peak_memory():
    """The tutorial's memory printout, on CPU: jitgrad's (numpy) buffers over a training step,
    fused against unfused. What the fused Function is for, saving only the convolution's
    input, shows in what the graph holds between forward and backward. (The peak over the
    whole step is printed too; at this small batch it is set by the backward's temporaries
    and the fc1 gradient, and the fused backward, recomputing the convolution, peaks higher.)
    The last step is read: the first ones also allocate the kernels' first-use caches."""
    held, peak = [], []
    for fused in (True, False):
        peaks = []
        tracemalloc.start()
        try:
            conv_bn_training(jitgrad, fused, [], peaks, epochs=1)
        finally:
            tracemalloc.stop()
        held.append(peaks[-1][0] / 1024**2)
        peak.append(peaks[-1][1] / 1024**2)
    print(f"fused peak memory: {peak[0]:.2f}MB, unfused peak memory: {peak[1]:.2f}MB")
    print(f"held for backward: fused {held[0]:.2f}MB, unfused {held[1]:.2f}MB")
    assert held[0] < held[1]


# ============================================================ numpy_extensions_tutorial
def numpy_extensions(T):
    from numpy.fft import irfft2, rfft2
    from scipy.signal import convolve2d, correlate2d
    Function = T.autograd.Function
    Module = T.nn.Module     # torch.nn.modules.module.Module: until the nn.modules path lands
    Parameter = importlib.import_module(T.__name__ + ".nn.parameter").Parameter
    gradcheck = importlib.import_module(T.__name__ + ".autograd.gradcheck").gradcheck
    r = np.random.default_rng(5)
    res = {}

    def new(t, data):
        """`t.new(data)`: until Tensor.new lands, a tensor of t's dtype from data."""
        return t.new(data) if T is torch else T.tensor(np.asarray(data), dtype=t.dtype)

    # torch 2.x refuses the tutorial's legacy (non-static) forward; the current tutorial's form
    class BadFFTFunction(Function):
        @staticmethod
        def forward(ctx, input):
            numpy_input = input.detach().numpy()
            result = abs(rfft2(numpy_input))
            return new(input, result)

        @staticmethod
        def backward(ctx, grad_output):
            numpy_go = grad_output.numpy()
            result = irfft2(numpy_go)
            return new(grad_output, result)

    def incorrect_fft(input):
        return BadFFTFunction.apply(input)

    input = same(T, T.randn(8, 8, requires_grad=True), r)
    result = incorrect_fft(input)
    print(result)
    result.backward(same(T, T.randn(result.size()), r))
    print(input)
    res["fft"], res["fft_grad"] = result, input.grad

    class ScipyConv2dFunction(Function):
        @staticmethod
        def forward(ctx, input, filter, bias):
            input, filter, bias = input.detach(), filter.detach(), bias.detach()
            result = correlate2d(input.numpy(), filter.numpy(), mode='valid')
            result += bias.numpy()
            ctx.save_for_backward(input, filter, bias)
            return T.as_tensor(result, dtype=input.dtype)

        @staticmethod
        def backward(ctx, grad_output):
            grad_output = grad_output.detach()
            input, filter, bias = ctx.saved_tensors
            grad_output = grad_output.numpy()
            grad_bias = np.sum(grad_output, keepdims=True)
            grad_input = convolve2d(grad_output, filter.numpy(), mode='full')
            grad_filter = correlate2d(input.numpy(), grad_output, mode='valid')
            return T.as_tensor(grad_input, dtype=input.dtype), T.as_tensor(grad_filter, dtype=filter.dtype), \
                T.as_tensor(grad_bias, dtype=bias.dtype)

    class ScipyConv2d(Module):
        def __init__(self, filter_width, filter_height):
            super(ScipyConv2d, self).__init__()
            self.filter = Parameter(T.randn(filter_width, filter_height))
            self.bias = Parameter(T.randn(1, 1))

        def forward(self, input):
            return ScipyConv2dFunction.apply(input, self.filter, self.bias)

    module = same_params(T, ScipyConv2d(3, 3), 6)
    print("Filter and bias: ", list(module.parameters()))
    input = same(T, T.randn(10, 10, requires_grad=True), r)
    output = module(input)
    print("Output from the convolution: ", output)
    output.backward(same(T, T.randn(8, 8), r))
    print("Gradient for the input map: ", input.grad)
    res["conv"], res["conv_input_grad"] = output, input.grad
    res["conv_filter_grad"], res["conv_bias_grad"] = module.filter.grad, module.bias.grad

    moduleConv = same_params(T, ScipyConv2d(3, 3), 7)
    input = [same(T, T.randn(20, 20, dtype=T.double, requires_grad=True), r)]
    test = gradcheck(moduleConv, input, eps=1e-6, atol=1e-4)
    print("Are the gradients correct: ", test)
    assert test
    return res


def test_numpy_extensions():
    both(numpy_extensions)
