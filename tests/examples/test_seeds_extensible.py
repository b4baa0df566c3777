"""The seed documents' examples that use custom Functions, hooks and anomaly mode, run
with `import jitgrad as torch` and compared with real PyTorch (which wins where a
document's comment disagrees)."""
import contextlib
import io

import pytest

import jitgrad

real_torch = pytest.importorskip("torch")
BOTH = pytest.mark.parametrize("torch", [jitgrad, real_torch], ids=["jitgrad", "torch"])


def run_printing(fn, torch):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(torch)
    return out.getvalue().replace("torch.", "")


def test_myfunc_custom_function_seed_002():
    def example(torch):
        class MyFunc(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * 2

            @staticmethod
            def backward(ctx, grad_output):
                x, = ctx.saved_tensors
                return grad_output * 2

        x = torch.tensor([1.5, -2.0], requires_grad=True)
        y = MyFunc.apply(x)
        y.sum().backward()
        print(type(y.grad_fn).__name__, y, x.grad)

    assert run_printing(example, jitgrad) == run_printing(example, real_torch)
    assert "MyFuncBackward" in run_printing(example, jitgrad)


def test_hook_for_debugging_seed_004():
    def example(torch):
        def hook_fn(grad):
            print(f"Gradient: {grad}")

        x = torch.tensor([2.0], requires_grad=True)
        x.register_hook(hook_fn)
        y = x ** 2
        y.backward()

    printed = run_printing(example, jitgrad)
    assert printed == run_printing(example, real_torch) == "Gradient: tensor([4.])\n"


def test_anomaly_mode_example_seed_000():
    def example(torch):
        with torch.autograd.anomaly_mode.set_detect_anomaly(True):
            x = torch.tensor([1.0], requires_grad=True)
            y = x ** 2
            z = y.sum()
            z.backward()
        print(x.grad)

    assert run_printing(example, jitgrad) == run_printing(example, real_torch) == "tensor([2.])\n"


@BOTH
def test_debugging_tips_seed_001(torch):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    loss = (x * x).sum()
    torch.autograd.set_detect_anomaly(True)
    try:
        loss.backward(retain_graph=True)
        assert loss.grad_fn.name() == "SumBackward0"
        assert loss.grad_fn.next_functions[0][0].name() == "MulBackward0"
        loss.backward(retain_graph=True)
    finally:
        torch.autograd.set_detect_anomaly(False)
    assert x.grad.tolist() == [4.0, 8.0]


@BOTH
def test_inplace_add_on_non_leaf_seed_004(torch):
    # the document says `y += 1` errors; in PyTorch it does not (MulBackward0 of a scalar
    # product saves nothing that += changes), and y's history becomes AddBackward0
    x = torch.tensor([2.0], requires_grad=True)
    y = x * 2
    y += 1
    assert type(y.grad_fn).__name__ == "AddBackward0"
    y.backward()
    assert x.grad.tolist() == [2.0]
