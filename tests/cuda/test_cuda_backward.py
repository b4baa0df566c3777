"""Backward on CUDA tensors, against the same graph on the CPU in float64: the device sweep
(engine/device.py, gpu/sweep*.py) for scalar chains, wide trees, broadcasting, views and
reductions; the hand-backs to Python (structural rows, custom Functions, hooks); the
Python engine's paths (create_graph, anomaly mode); the errors of freed graphs, in-place
writes and mixed devices; and that a CUDA row never reaches the CPU sweep. Shapes are
small: the simulator runs every CUDA thread as a Python thread."""
import os
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest
from conftest import ROOT, assert_close

import jitgrad
from jitgrad._core.layout import DT_F64, PYNODE
from jitgrad.engine import compiled as _compiled
from jitgrad.engine import device as _device
from jitgrad.engine.run import Target

F64 = jitgrad.float64


def both(data, dtype=F64):
    """The same leaf on the CPU and on the GPU."""
    return (jitgrad.tensor(data, dtype=dtype, requires_grad=True),
            jitgrad.tensor(data, dtype=dtype, device="cuda", requires_grad=True))


def launches():
    return _device.host().LAUNCHES[0]


def check(fn, *datas, dtype=F64, rtol=1e-10, atol=1e-12):
    """fn on CPU leaves and on CUDA leaves: the same outputs and the same .grad, the CUDA
    ones on the device. Returns the kernel launches the CUDA backward made."""
    pairs = [both(d, dtype) for d in datas]
    cpu = fn(*(p[0] for p in pairs))
    gpu = fn(*(p[1] for p in pairs))
    assert gpu.is_cuda
    assert_close(gpu.cpu(), cpu, rtol, atol, "forward")
    cpu.backward()
    before = launches()
    gpu.backward()
    made = launches() - before
    for k, (c, g) in enumerate(pairs):
        assert g.grad.is_cuda, f"leaf {k}: .grad not on the device"
        assert_close(g.grad.cpu(), c.grad, rtol, atol, f"leaf {k} grad")
    return made


def test_scalar_chain_runs_in_a_constant_number_of_launches():
    def chain(n):
        def fn(x):
            y = x
            for i in range(n):
                y = (y * 0.9 + 0.1).sin() if i % 2 else y.exp() * 0.5 - y
            return y
        return fn
    short = check(chain(10), 0.3)
    long = check(chain(60), 0.3)
    assert short == long <= 5, (short, long)  # fills, the seed, one sweep: not one per node
    assert short >= 1  # the device sweep ran (not the Python engine)


def test_wide_tree_of_scalars():
    data = list(np.linspace(-1.0, 1.0, 24))

    def fn(x):
        parts = [x[i] * x[(i + 1) % 24] for i in range(24)]
        total = parts[0]
        for p in parts[1:]:
            total = total + p.tanh()
        return total
    check(fn, data)


@pytest.mark.parametrize("op", ["mul", "div", "pow", "maximum", "where", "clamp", "sigmoid"])
def test_broadcasting_elementwise_grads_reduce_to_each_input(op):
    a = np.array([[0.5], [1.5], [-2.0]])           # (3, 1)
    b = np.array([1.25, -0.75, 2.0, 0.5])         # (4,)

    def fn(x, y):
        if op == "mul":
            z = x * y
        elif op == "div":
            z = x / y
        elif op == "pow":
            z = x.abs() ** y
        elif op == "maximum":
            z = jitgrad.maximum(x, y)
        elif op == "where":
            z = jitgrad.where(y > 0.6, x, y)
        elif op == "clamp":
            z = (x * y).clamp(-0.5, 1.0)
        else:
            z = (x - y).sigmoid()
        return (z * z).sum()
    assert 1 <= check(fn, a, b) <= 5


def test_views_expand_permute_and_reductions_run_on_the_device():
    def fn(x):
        y = x.reshape(2, 3, 2).transpose(0, 2).unsqueeze(0)          # (1, 2, 3, 2)
        y = y.expand(4, 2, 3, 2) * 1.5
        y = y.permute(3, 1, 0, 2).sum(dim=2, keepdim=True)             # (2, 2, 1, 3)
        return y.mean(dim=(0, 1)).squeeze().exp().sum()
    made = check(fn, np.linspace(-1.0, 1.0, 12))
    assert 1 <= made <= 5, made  # no hand-back: every row ran in the sweep


def test_stack_and_cat_of_many_and_of_repeated_inputs():
    def tree(*xs):  # a stack of more scalar leaves than the simulator's block has threads
        return jitgrad.stack([(x * 2.0).sin() + 1.0 for x in xs]).sum()
    assert 1 <= check(tree, *np.linspace(-1.0, 1.0, 20)) <= 5
    made = check(lambda x, y: (jitgrad.cat([x, y, x], dim=1) ** 2.0).sum(), [[0.5, 1.0]], [[2.0]])
    assert 1 <= made <= 5  # x twice: its two slices add into one buffer


def test_float32_on_the_device():
    check(lambda x, y: ((x * y).exp() + x.sin()).sum(), [0.1, 0.2, 0.3], [[1.0], [2.0]],
          dtype=jitgrad.float32, rtol=1e-5, atol=1e-6)


def test_structural_rows_hand_back_and_the_sweep_resumes():
    a = np.arange(6.0).reshape(2, 3) / 7
    b = np.arange(12.0).reshape(3, 4) / 5

    def fn(x, w):
        h = (x @ w).tanh()                       # matmul: its rule runs on the device
        return (h.softmax(dim=1) * h).sum() + (h * h).sum()
    made = check(fn, a, b)
    assert made > 5  # the two hand-backs relaunch the sweep below them


class _SinCos(jitgrad.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin(), x.cos()

    @staticmethod
    def backward(ctx, gs, gc):
        (x,) = ctx.saved_tensors
        return gs * x.cos() - gc * x.sin()


def test_multi_output_node_and_shared_inputs():
    def both_outputs(x):
        s, c = _SinCos.apply(x * 2.0)
        return (s * c * x).sum() + c.exp().sum()

    def one_output(x):  # the other output gets no gradient
        s, _ = _SinCos.apply(x * x)
        return (s * x).sum()
    check(both_outputs, [0.1, 0.2, 0.3, 0.4])
    check(one_output, [0.1, 0.2, 0.3, 0.4])


def test_a_graph_over_several_tapes():
    from jitgrad.graph.tape import close_current_tape

    def fn(x):
        y = x * x + x
        close_current_tape()          # what follows records onto a new tape, linked by an EXT row
        z = (y.sin() * x).sum()
        close_current_tape()
        return z * y.sum()
    assert 1 <= check(fn, [0.2, -0.4, 0.9]) <= 15  # per tape: two fills, its seeds, one sweep; no hand-back


def test_leaf_grad_accumulates_in_place_on_the_device():
    x = jitgrad.tensor([1.0, 2.0], dtype=F64, device="cuda", requires_grad=True)
    (x * x).sum().backward()
    g = x.grad
    (x * 3.0).sum().backward()
    assert x.grad is g and g.is_cuda
    assert_close(g.cpu(), np.array([5.0, 7.0]))


def test_autograd_grad_with_inputs_and_an_intermediate():
    xc, xg = both([0.5, -1.0, 2.0])
    out = []
    for x in (xc, xg):
        y = x.sin() * x
        z = (y * y).sum()
        out.append(jitgrad.autograd.grad(z, (x, y)))
    for c, g in zip(*out):
        assert g.is_cuda
        assert_close(g.cpu(), c)
    assert xg.grad is None


def test_grads_batched_and_a_backward_in_another_thread():
    x = jitgrad.tensor([0.5, 1.0, 2.0], dtype=F64, device="cuda", requires_grad=True)
    (jac,) = jitgrad.autograd.grad(x.sin() * x, x, jitgrad.eye(3, dtype=F64, device="cuda"), is_grads_batched=True)
    xs = np.array([0.5, 1.0, 2.0])
    assert jac.is_cuda
    assert_close(jac.cpu(), np.diag(np.cos(xs) * xs + np.sin(xs)))
    z = (x.exp() * x).sum()
    out = []
    worker = threading.Thread(target=lambda: out.append(jitgrad.autograd.grad(z, x)))
    worker.start()
    worker.join()
    assert_close(out[0][0].cpu(), np.exp(xs) * (1 + xs))


def test_retain_graph_and_a_second_backward_through_a_freed_graph():
    x = jitgrad.tensor([0.5, 1.5], dtype=F64, device="cuda", requires_grad=True)
    y = (x.exp() * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert_close(x.grad.cpu(), 2 * (np.exp([0.5, 1.5]) * (1 + np.array([0.5, 1.5]))))
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        y.backward()


def test_in_place_write_to_a_saved_value_is_caught():
    x = jitgrad.tensor([0.5, 1.5], dtype=F64, device="cuda", requires_grad=True)
    y = x * 2.0
    z = (y * y).sum()
    y.mul_(3.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


def test_tensor_hooks_retain_grad_and_node_hooks():
    seen = {}
    for dev in ("cpu", "cuda"):
        x = jitgrad.tensor([0.5, -1.0, 2.0], dtype=F64, device=dev, requires_grad=True)
        y = x * x
        y.retain_grad()
        y.register_hook(lambda g: g * 2.0)
        z = y.sin()
        z.grad_fn.register_prehook(lambda gs: (gs[0] + 1.0,))
        z.grad_fn.register_hook(lambda gi, go: (gi[0] * 0.5,))
        x.register_hook(lambda g: g - 1.0)
        z.sum().backward()
        seen[dev] = (x.grad, y.grad)
    for c, g in zip(seen["cpu"], seen["cuda"]):
        assert g.is_cuda
        assert_close(g.cpu(), c)


def test_hooks_writing_the_gradient_in_place_count_on_the_device_sweep():
    # torch's hooks get the engine's own buffer: a tensor hook or node pre-hook that writes
    # the gradient in place (returning it or None) changes what flows on (issue 26)
    seen = {}
    for dev in ("cpu", "cuda"):
        out = []
        for ret in (True, False):
            a = jitgrad.tensor([1.0, 2.0], dtype=F64, device=dev, requires_grad=True)
            b = a * 2

            def hook(g, ret=ret):
                g.mul_(2)
                return g if ret else None

            b.register_hook(hook)
            (b * 3).sum().backward()
            out.append(a.grad.cpu())
            d = (a * 2) * 3

            def pre(gs):
                gs[0].mul_(5)

            d.grad_fn.register_prehook(pre)
            a.grad = None
            (d * jitgrad.tensor([1.0, 1.5], dtype=F64, device=dev)).sum().backward()
            out.append(a.grad.cpu())
        seen[dev] = out
    assert [g.tolist() for g in seen["cpu"]] == [[12.0, 12.0], [30.0, 45.0]] * 2
    for c, g in zip(seen["cpu"], seen["cuda"]):
        assert_close(g, c)


class _Cube(jitgrad.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3.0 * x * x


class _ToHost(jitgrad.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        return grad.cpu()


def test_custom_function_on_cuda():
    check(lambda x: (_Cube.apply(x.sin()) * 2.0).sum(), [0.1, -0.7, 1.3])


def test_custom_function_returning_a_host_gradient_is_an_error():
    x = jitgrad.tensor([1.0, 2.0], dtype=F64, device="cuda", requires_grad=True)
    with pytest.raises(RuntimeError, match="returned an invalid gradient at index 0 - expected device cuda:0"):
        (_ToHost.apply(x) * x).sum().backward()


def test_create_graph_double_backward():
    grads = []
    for dev in ("cpu", "cuda"):
        x = jitgrad.tensor([0.3, -0.8, 1.1], dtype=F64, device=dev, requires_grad=True)
        y = (x.sin() * x * x).sum()
        (g,) = jitgrad.autograd.grad(y, x, create_graph=True)
        (g * g).sum().backward()
        grads.append((g.detach(), x.grad))
    for c, g in zip(*grads):
        assert g.is_cuda
        assert_close(g.cpu(), c)


def test_anomaly_mode_names_the_node_that_made_nan():
    x = jitgrad.tensor([0.0, 1.0], dtype=F64, device="cuda", requires_grad=True)
    with jitgrad.autograd.set_detect_anomaly(True), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = (x.sqrt() * 0.0).sum()
        with pytest.raises(RuntimeError, match="Function 'SqrtBackward0' returned nan values in its 0th output"):
            y.backward()


def test_mixed_devices_raise_torchs_errors():
    c = jitgrad.tensor([1.0, 2.0], dtype=F64, requires_grad=True)
    g = jitgrad.tensor([1.0, 2.0], dtype=F64, device="cuda", requires_grad=True)
    msg = "Expected all tensors to be on the same device, but found at least two devices"
    with pytest.raises(RuntimeError, match=msg):
        c * g
    y = g * g
    with pytest.raises(RuntimeError, match="invalid gradient at index 0 - expected device cuda:0 but got cpu"):
        y.backward(jitgrad.ones(2, dtype=F64))


def test_a_graph_crossing_devices_runs_through_the_python_engine():
    xc, xg = both([0.5, 1.0, 1.5])
    (xc.sin() * 2.0).sum().backward()
    ((xg.sin().cpu() * 2.0).cuda()).sum().backward()
    assert xg.grad.is_cuda
    assert_close(xg.grad.cpu(), xc.grad)


def test_the_cpu_sweep_never_runs_a_cuda_row():
    x = jitgrad.tensor([0.5, 1.0], dtype=F64, device="cuda", requires_grad=True)
    y = (x.exp() * x).sum()
    tape = y._tape
    assert all(tape.dtcode(r) in (3, 4) for r in range(tape.nrows))  # DT_CUDA_F64 / F32
    # handed to the CPU engine as if its gradient were host data: it declines the call
    root = Target(y.grad_fn, tape, y._row, 0)
    host_grad = jitgrad.tensor(1.0, dtype=F64)
    out = _compiled.run([root], [host_grad], None, True, [tape])
    assert isinstance(out, _compiled.Fallback) and "CUDA" in out.reason
    # and the CPU sweep itself hands back the first CUDA row it meets, reading nothing of it
    r = _compiled._TapeRun(tape, DT_F64)
    cols = r._columns()
    status, row, _, _ = _compiled.scheduler().backward(
        *cols[:6], r.st, np.zeros(tape.nrows, np.int8), np.array([y._row]), np.array([0, 1]), np.ones(1),
        np.zeros(0, np.int64), y._row, True, DT_F64, r.grads[DT_F64].kt)
    del cols
    assert (status, row) == (PYNODE, y._row)
    y.backward()
    assert_close(x.grad.cpu(), np.exp([0.5, 1.0]) * (1 + np.array([0.5, 1.0])))


def test_a_large_row_hands_back_and_still_matches(monkeypatch):
    # rows above BIG_ROW elements run their Tensor-level rule (over the whole GPU)
    monkeypatch.setattr(_device.host(), "BIG_ROW", 4)
    made = check(lambda x, y: ((x * y).sin() + x).sum(), [[0.1, 0.2, 0.3]], [[1.0], [2.0]])
    assert made > 5  # the (2, 3) rows handed back, and the sweep resumed below each


PTX = textwrap.dedent("""
    import types
    import numba.cuda.dispatcher as disp
    # no GPU here: the device functions' compile asks the current device for its compute
    # capability; stand in for it (compile_ptx itself is told cc=(8, 0))
    disp.get_current_device = lambda: types.SimpleNamespace(compute_capability=(8, 0))
    import numpy as np
    from jitgrad.engine import device
    for dt in (np.float64, np.float32):
        code = device.ptx(dt)
        assert ".entry" in code and "bar.sync" in code, code[:500]
        # saved values and gradients are read and written through device addresses
        assert "ld.global" in code and "st.global" in code
    print("ok")
""")


@pytest.mark.no_gpu
def test_the_sweep_kernel_compiles_for_the_gpu():
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "NUMBA_DISABLE_JIT")}
    out = subprocess.run([sys.executable, "-c", PTX], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
