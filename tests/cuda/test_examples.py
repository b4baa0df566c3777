"""The main job and the benchmarks on CUDA: python -m jitgrad.examples.digits --device cuda
(in its short mode: a few batches, on the simulator in CI) trains as the CPU run does,
loss for loss; the CUDA benchmark workloads run at tiny sizes, so they do not rot while
no GPU runs them."""
import os

import numpy as np
import pytest

import jitgrad

pytest.importorskip("sklearn")
from jitgrad.examples import digits  # noqa: E402

SUBSET, BATCH = 48, 16          # 3 steps an epoch: the simulator runs each GPU thread in Python


def _subset(n=SUBSET):
    return tuple(a[:n] for a in digits.load_split())


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_cuda_training_follows_the_cpu_run(kind):
    """Same weights, same batches: the CUDA run's losses, accuracy and trained weights are
    the CPU run's (float32; the device sums in another order)."""
    data = _subset()
    weights = digits.initial_weights([64, 16, 16, 10]) if kind == "mlp" else digits.cnn_weights()
    runs = {dev: digits.train(jitgrad, weights, data, 2, BATCH, 3e-3, progress=False, kind=kind, device=dev)
            for dev in ("cpu", "cuda")}
    (cpu_model, cpu_losses, _, cpu_acc), (cuda_model, cuda_losses, times, cuda_acc) = runs["cpu"], runs["cuda"]
    assert len(cuda_losses) == len(cpu_losses) == 2 * SUBSET // BATCH and len(times) == 2
    np.testing.assert_allclose(cuda_losses, cpu_losses, rtol=1e-5)
    assert cuda_acc == cpu_acc
    for (name, p), (_, q) in zip(cuda_model.named_parameters(), cpu_model.named_parameters()):
        assert p.device == jitgrad.device("cuda", 0) and p.grad.is_cuda, name
        np.testing.assert_allclose(p.detach().cpu().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_batches_are_gathered_on_the_device():
    """run_epoch on device tensors: each batch is a gather of the device data, in the order given."""
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    y = np.arange(10)
    order = np.random.default_rng(0).permutation(10)
    seen = []

    def step(xb, yb):
        assert xb.is_cuda and yb.is_cuda
        seen.append((xb.cpu().numpy(), yb.cpu().numpy()))
        return (xb.sum() - yb.sum()).float()

    losses = digits.run_epoch(jitgrad, step, jitgrad.tensor(x, device="cuda"), jitgrad.tensor(y, device="cuda"),
                              order, 4)
    assert [len(b[1]) for b in seen] == [4, 4, 2]
    for (xb, yb), s in zip(seen, range(0, 10, 4)):
        np.testing.assert_array_equal(xb, x[order[s:s + 4]])
        np.testing.assert_array_equal(yb, y[order[s:s + 4]])
    assert losses == [float(x[order[s:s + 4]].sum() - y[order[s:s + 4]].sum()) for s in range(0, 10, 4)]


def test_main_job_with_device_cuda(tmp_path, capsys):
    accs = digits.main(["--device", "cuda", "--epochs", "1", "--subset", str(SUBSET), "--batch-size", str(BATCH),
                        "--hidden", "16", "--no-progress", "--no-torch", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("device: cuda:0, "), out
    assert f"digits: {SUBSET} train / {SUBSET} test images" in out, out
    assert out.count("test accuracy") == 2 and set(accs) == {"mlp", "cnn"}, out
    for kind, node in (("mlp", "AddmmBackward0"), ("cnn", "ConvolutionBackward0")):
        graphs = [p for p in os.listdir(tmp_path) if p.startswith(f"{kind}_graph")]
        try:
            import graphviz  # noqa: F401
            assert graphs, out
            assert node in open(tmp_path / graphs[0]).read()
        except ImportError:
            assert "model graph: skipped" in out
