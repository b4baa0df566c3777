"""The main job and the benchmarks on CUDA: python -m jitgrad.examples.digits --device cuda
(in its short mode: a few batches, on the simulator in CI) trains as the CPU run does,
loss for loss; the CUDA benchmark workloads run at tiny sizes, so they do not rot while
no GPU runs them."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT

import jitgrad
from jitgrad import __main__ as demo

pytest.importorskip("sklearn")
if ROOT not in sys.path:            # the benchmarks package, as asv and side_by_side.py import it
    sys.path.insert(0, ROOT)
from benchmarks import bench_cuda, cuda_workloads, side_by_side  # noqa: E402
from jitgrad.examples import digits  # noqa: E402

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
# The simulator runs each GPU thread as a Python thread: a few small batches. The CNN's
# convolutions (im2col products) cost the most there, so it gets the fewest.
SUBSET, BATCH = 48, 16
SIZES = {"mlp": (SUBSET, BATCH, 2), "cnn": (4, 2, 1)}   # images, batch, epochs


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_cuda_training_follows_the_cpu_run(kind):
    """Same weights, same batches: the CUDA run's losses, accuracy and trained weights are
    the CPU run's (float32; the device sums in another order)."""
    n, batch, epochs = SIZES[kind]
    data = tuple(a[:n] for a in digits.load_split())
    weights = digits.initial_weights([64, 16, 16, 10]) if kind == "mlp" else digits.cnn_weights()
    runs = {dev: digits.train(jitgrad, weights, data, epochs, batch, 3e-3, progress=False, kind=kind, device=dev)
            for dev in ("cpu", "cuda")}
    (cpu_model, cpu_losses, _, cpu_acc), (cuda_model, cuda_losses, times, cuda_acc) = runs["cpu"], runs["cuda"]
    assert len(cuda_losses) == len(cpu_losses) == epochs * n // batch and len(times) == epochs
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
    """The command line's CUDA path (the CNN's training on the device is checked above)."""
    accs = digits.main(["--device", "cuda", "--model", "mlp", "--epochs", "1", "--subset", str(SUBSET),
                        "--batch-size", str(BATCH), "--hidden", "16", "--no-progress", "--no-torch",
                        "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("device: cuda:0, "), out
    assert f"digits: {SUBSET} train / {SUBSET} test images" in out, out
    assert out.count("test accuracy") == 1 and set(accs) == {"mlp"}, out
    graphs = [p for p in os.listdir(tmp_path) if p.startswith("mlp_graph")]
    try:
        import graphviz  # noqa: F401
        assert graphs, out
        assert "AddmmBackward0" in open(tmp_path / graphs[0]).read()
    except ImportError:
        assert "model graph: skipped" in out


# --- the CUDA benchmarks (benchmarks/cuda_workloads.py, side_by_side.py, bench_cuda.py) ---

def test_cuda_benchmark_workloads_agree_with_torch_at_tiny_sizes():
    """Every CUDA workload, tiny, on jitgrad's device against PyTorch on the CPU."""
    assert cuda_workloads.check(jitgrad, torch, "cuda", "cpu", tiny=True, rtol=1e-4) == []


def test_cuda_rows_time_through_side_by_side():
    """The rows side_by_side.py times on a GPU go through its timing and report code."""
    rows = cuda_workloads.timed_rows(jitgrad, torch, tiny=True, torch_device="cpu")
    assert [r["key"] for r in rows] == list(cuda_workloads.TARGETS)
    results = {"timings": [], "memory": [], "startup": [], "agreement_problems": []}
    for r in rows:
        res = side_by_side.measure_phase(r["sides"], warmup=0, repeats=1, min_time=0, max_wall=0)
        assert set(res) == {"jitgrad", "torch cuda"} and all(t > 0 for t in res.values())
        ratio = res["jitgrad"] / res["torch cuda"]
        results["timings"].append({"workload": r["key"][0], "phase": r["key"][1], "vs": r["vs"],
                                   "target": r["target"], "jitgrad_s": res["jitgrad"], "ref_s": res["torch cuda"],
                                   "ratio": ratio, "pass": ratio <= r["target"]})
    side_by_side.print_report(results)


@pytest.mark.skipif(not SIMULATED, reason="what a machine without a GPU says; a GPU times the rows instead")
def test_without_a_gpu_the_cuda_benchmarks_say_so():
    rows = cuda_workloads.cuda_comparisons(jitgrad, torch)
    assert [r["skipped"] for r in rows] == ["skipped: simulator, no GPU"] * len(cuda_workloads.TARGETS)
    for bench in (bench_cuda.ChainBackward(), bench_cuda.DigitsCNNStep()):
        with pytest.raises(NotImplementedError, match="simulator, no GPU"):
            bench.setup()


# --- python -m jitgrad: the CUDA backward beside PyTorch CUDA, or "no CUDA device" ---------

@pytest.mark.no_gpu
def test_demo_shows_the_cuda_section():
    out = subprocess.run([sys.executable, "-m", "jitgrad", "--nodes", "200", "--cuda-nodes", "200"], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    at = lines.index("== CUDA backward: scalar chain of 200 nodes, float32 ==")
    if SIMULATED or not jitgrad.cuda.is_available():
        assert lines[at + 1].startswith("no CUDA device"), out.stdout
    else:
        assert any(ln.startswith("jitgrad cuda:") for ln in lines[at:]), out.stdout


def test_demo_chain_runs_on_the_device():
    """The timed CUDA chain (float32 on the device) gives the CPU chain's gradient."""
    _, _, dx = demo._chain(jitgrad, 20, "cuda")
    _, _, want = demo._chain(jitgrad, 20)
    assert dx == pytest.approx(want, rel=1e-6)
