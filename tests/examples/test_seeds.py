"""Examples from the seed documents (/work/shared/seeds/*.txt), run with ``import jitgrad as torch``.

Examples needing custom autograd.Function, hooks, anomaly mode, nn modules,
optimizers or in-place ops on leaves are intentionally not copied here.
"""
import math

import pytest

import jitgrad as torch  # noqa: F401 - the whole point - the seed code runs unchanged


def names(node_pairs):
    return [None if n is None else type(n).__name__ for n, _ in node_pairs]


# ------------------------------------------------------------ 000: data flow

def test_seed000_simple_computation():
    x = torch.tensor([2.0], requires_grad=True)
    w = torch.tensor([3.0], requires_grad=True)
    y = x * w        # Creates MulBackward0 node
    z = y + 1        # Creates AddBackward0 node
    loss = z.sum()   # Creates SumBackward0 node
    assert type(y.grad_fn).__name__ == "MulBackward0"
    assert type(z.grad_fn).__name__ == "AddBackward0"
    assert type(loss.grad_fn).__name__ == "SumBackward0"
    loss.backward()
    assert x.grad.tolist() == [3.0]
    assert w.grad.tolist() == [2.0]
    assert repr(x.grad) == "tensor([3.])"
    assert repr(w.grad) == "tensor([2.])"


def test_seed000_multiple_paths():
    x = torch.tensor([2.0], requires_grad=True)
    y = x * 3
    z = x * 2
    loss = y + z
    assert names(loss.grad_fn.next_functions) == ["MulBackward0", "MulBackward0"]
    loss.backward()
    assert repr(x.grad) == "tensor([5.])"


def test_seed000_gradient_accumulation_at_edges():
    x = torch.tensor([1.0], requires_grad=True)
    y = x * 2
    z = x * 3
    loss = y + z
    loss.backward()
    assert repr(x.grad) == "tensor([5.])"


def test_seed000_input_buffer_x_plus_x():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x + x
    y.sum().backward()
    assert repr(x.grad) == "tensor([2., 2.])"


def test_seed000_backward_full_accumulation():
    x = torch.tensor([1.0], requires_grad=True)
    y = x * 2
    z = y * 3
    # The seed calls z.backward() twice without retain_graph; real PyTorch raises
    # "Trying to backward through the graph a second time" there, so keep the graph.
    z.backward(retain_graph=True)
    assert repr(x.grad) == "tensor([6.])"
    x.grad.zero_()
    z.backward()
    assert repr(x.grad) == "tensor([6.])"


def test_seed000_selective_capture():
    x = torch.tensor([1.0], requires_grad=True)
    y = x * 2
    z = y * 3
    grad_x = torch.autograd.grad(z, x)
    assert repr(grad_x) == "(tensor([6.]),)"
    assert x.grad is None


def test_seed000_selective_execution():
    x = torch.tensor([1.0], requires_grad=True)
    y = torch.tensor([2.0], requires_grad=True)
    z = x * 2
    w = y * 3
    loss = z + w
    grad_x = torch.autograd.grad(loss, x)
    assert repr(grad_x) == "(tensor([2.]),)"
    assert x.grad is None and y.grad is None


# ------------------------------------------------------------ 001: quick reference

def test_seed001_complete_example():
    x = torch.tensor([2.0], requires_grad=True)
    y = x * 3
    z = y + 2
    loss = z.sum()
    assert [type(t.grad_fn).__name__ for t in (y, z, loss)] == ["MulBackward0", "AddBackward0", "SumBackward0"]
    # x ──[MulBackward0]──> y ──[AddBackward0]──> z ──[SumBackward0]──> loss
    assert loss.grad_fn.next_functions[0][0] is z.grad_fn
    assert z.grad_fn.next_functions[0][0] is y.grad_fn
    assert y.grad_fn.next_functions[0][0].variable is x
    loss.backward()
    assert repr(x.grad) == "tensor([3.])"


def test_seed001_multi_path():
    x = torch.tensor([1.0], requires_grad=True)
    y = x * 2
    z = x * 3
    loss = y + z
    loss.backward()
    assert repr(x.grad) == "tensor([5.])"


def test_seed001_debugging_tips():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    loss = (x * x).sum()
    assert str(loss.grad_fn).startswith("<SumBackward0 object at 0x")
    assert names(loss.grad_fn.next_functions) == ["MulBackward0"]
    assert x.requires_grad
    loss.backward(retain_graph=True)
    loss.backward()
    assert x.grad.tolist() == [4.0, 8.0]


# ------------------------------------------------------------ 003: computational graphs

def test_seed003_dynamic_construction():
    x = torch.tensor([1., 2., 3.], requires_grad=True)
    assert x.grad_fn is None
    y = x ** 2
    assert type(y.grad_fn).__name__ == "PowBackward0"
    z = y.sum()
    assert type(z.grad_fn).__name__ == "SumBackward0"
    assert f"{z.grad_fn}".startswith("<SumBackward0 object at ")


def test_seed003_tracing_the_graph():
    x = torch.randn(3, requires_grad=True)
    y = x * 2
    z = y.sum()
    assert names(z.grad_fn.next_functions) == ["MulBackward0"]
    # ((AccumulateGrad, 0), (None, 0)) in real PyTorch: the python scalar has no node
    assert names(y.grad_fn.next_functions) == ["AccumulateGrad", None]
    assert y.grad_fn.next_functions[0][1] == 0


def test_seed003_graph_consumption():
    x = torch.randn(3, requires_grad=True)
    loss = (x ** 2).sum()
    loss.backward()
    first = x.grad.clone()
    for g, v in zip(first.tolist(), x.detach().tolist()):
        assert g == pytest.approx(2 * v, rel=1e-6)
    with pytest.raises(RuntimeError) as ei:
        loss.backward()
    assert str(ei.value).startswith("Trying to backward through the graph a second time")


def test_seed003_retain_graph():
    x = torch.randn(3, requires_grad=True)
    loss = (x ** 2).sum()
    loss.backward(retain_graph=True)
    grad_after_first = x.grad.clone()
    loss.backward()
    grad_after_second = x.grad.clone()
    for a, b in zip(grad_after_first.tolist(), grad_after_second.tolist()):
        assert b == pytest.approx(2 * a, rel=1e-6)


def test_seed003_memory_best_practice():
    x = torch.randn(3, requires_grad=True)
    (x ** 2).sum().backward()
    x.grad.zero_()
    loss = (x ** 2).sum()
    loss.backward()
    for g, v in zip(x.grad.tolist(), x.detach().tolist()):
        assert g == pytest.approx(2 * v, rel=1e-6)


def test_seed003_grad_fn_of_trace():
    x = torch.randn(2, 3, requires_grad=True)
    y = x @ x.T
    z = y.trace()
    assert f"{z.grad_fn}".startswith("<TraceBackward0 object at ")
    assert type(z.grad_fn).__name__ == "TraceBackward0"
    z.backward()
    # d trace(x x^T) / dx = 2x
    for g, v in zip(sum(x.grad.tolist(), []), sum(x.detach().tolist(), [])):
        assert g == pytest.approx(2 * v, rel=1e-5, abs=1e-6)


def test_seed003_chain_rule():
    x = torch.tensor([2.0], requires_grad=True)
    y = torch.sin(x)
    z = y ** 2
    z.backward()
    assert f"{x.grad.item():.6f}" == "-0.756802"  # sin(2x) at x=2 is sin(4) = -0.756802
    assert f"{torch.sin(2*x.detach()).item():.6f}" == "-0.756802"
    assert x.grad.item() == pytest.approx(math.sin(4.0), rel=1e-6)


def test_seed003_safe_update_after_backward():
    x = torch.tensor([1.], requires_grad=True)
    y = x * 2
    y.sum().backward()
    with torch.no_grad():
        x2 = x + 1  # (the seed uses x += 1; in-place ops on leaves are out of scope here)
    assert x2.tolist() == [2.0] and not x2.requires_grad
    assert x.grad.tolist() == [2.0]


def test_seed003_print_graph():
    lines = []

    def print_graph(tensor, indent=0):
        prefix = "  " * indent
        lines.append(f"{prefix}Tensor shape: {tuple(tensor.shape)}")
        if tensor.grad_fn is not None:
            lines.append(f"{prefix}grad_fn: {type(tensor.grad_fn).__name__}")
            for func, idx in tensor.grad_fn.next_functions:
                if func is not None:
                    lines.append(f"{prefix}  ↑ {type(func).__name__}")

    x = torch.randn(2, 3, requires_grad=True)
    y = x.sum(dim=1)
    z = y.mean()
    print_graph(z)
    assert lines == ["Tensor shape: ()", "grad_fn: MeanBackward0", "  ↑ SumBackward1"]


def test_seed003_multiple_uses():
    x = torch.tensor([3.0], requires_grad=True)
    y = x ** 2 + x ** 3
    y.backward()
    assert repr(x.grad) == "tensor([33.])"


def test_seed003_branching_and_merging():
    x = torch.tensor([2.0], requires_grad=True)
    y1 = x * 2
    y2 = x * 3
    z = y1 + y2
    z.backward()
    assert repr(x.grad) == "tensor([5.])"


# ------------------------------------------------------------ 004: grad_fn

def test_seed004_simple_example():
    x = torch.tensor([2.0], requires_grad=True)
    y = x ** 2
    z = y + 3
    assert x.grad_fn is None
    assert f"{y.grad_fn}".startswith("<PowBackward0 object at 0x")
    assert f"{z.grad_fn}".startswith("<AddBackward0 object at 0x")


def test_seed004_leaf_and_non_leaf():
    x = torch.tensor([2.0], requires_grad=True)
    assert x.is_leaf is True
    assert x.grad_fn is None
    y = x * 2
    assert y.is_leaf is False
    assert type(y.grad_fn).__name__ == "MulBackward0"


def test_seed004_grad_fn_chain():
    x = torch.tensor([2.0], requires_grad=True)
    y = x * 2
    z = y + 3
    assert type(z.grad_fn).__name__ == "AddBackward0"
    # The seed's comment claims ((MulBackward0, 0), (AccumulateGrad, 0)); real PyTorch
    # gives ((MulBackward0, 0), (None, 0)) because the constant 3 has no node.
    assert names(z.grad_fn.next_functions) == ["MulBackward0", None]
    assert z.grad_fn.next_functions[1] == (None, 0)


def test_seed004_manual_inspection():
    x = torch.tensor([2.0], requires_grad=True)
    y = x ** 2
    z = y + 3
    out = []

    def print_graph(node, indent=0):
        out.append(" " * indent + type(node).__name__)
        for next_fn, _ in node.next_functions:
            if next_fn is not None:
                print_graph(next_fn, indent + 2)

    print_graph(z.grad_fn)
    # seed output lists an extra AccumulateGrad for the constant; PyTorch prints only these:
    assert out == ["AddBackward0", "  PowBackward0", "    AccumulateGrad"]


def test_seed004_requires_grad_checks_and_retain_grad():
    x = torch.tensor([2.0], requires_grad=True)
    y = x * 2
    z = y + 3
    assert x.requires_grad and y.requires_grad and z.requires_grad
    y.retain_grad()
    z.backward()
    assert repr(y.grad) == "tensor([1.])"
    assert repr(x.grad) == "tensor([2.])"
