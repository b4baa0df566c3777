"""The digits main job data-parallel: mpiexec -n 2 python -m jitgrad.examples.digits
--distributed, in a short mode, and the README's distributed training loop, under
mpiexec -n 2 and as one plain process (each bounded by a timeout: a hang fails the test)."""
import os
import re
import sys

import pytest
from conftest import ROOT
from mpijob import MPIEXEC, needs_mpi, run

pytest.importorskip("sklearn")
from jitgrad.examples import digits  # noqa: E402


def run_job(ranks, *args, timeout=600):
    # -prepend-rank (MPICH's hydra) tags every line with its rank: rank 1 must say nothing
    return run([MPIEXEC, "-prepend-rank", "-n", ranks, sys.executable, "-m", "jitgrad.examples.digits",
                "--distributed", *args], timeout=timeout)


@needs_mpi
def test_two_ranks_train_both_models_and_rank_0_alone_reports(tmp_path):
    rc, out, err = run_job(2, "--epochs", "3", "--no-progress", "--out", tmp_path)
    report = f"rc={rc}\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}"
    assert rc == 0, report
    lines = out.splitlines()
    assert lines and all(ln.startswith("[0] ") for ln in lines), report
    assert "distributed: 2 ranks" in out and "16 images a step on each rank" in out, report
    assert "batch 32" in out, report        # the global batch is --batch-size's default
    accs = [float(a) for a in re.findall(r"test accuracy ([\d.]+)%", out)]
    # as the single-process short run: ~95% (MLP) and ~90% (CNN) after 3 epochs; chance is 10%
    assert len(accs) == 2 and accs[0] > 90 and accs[1] > 80, report
    # and exactly what one process learns on the same global batches (float32 rounding
    # may move a prediction at a tie: one test image of 359 is 0.28%)
    for kind, acc in zip(("mlp", "cnn"), accs):
        assert abs(acc - 100 * single_process_accuracy(kind, epochs=3)) < 0.3, (kind, report)
    assert "PyTorch" not in out, report
    for kind in ("mlp", "cnn"):
        written = [p for p in os.listdir(tmp_path) if p.startswith(kind)]
        assert written, report


def single_process_accuracy(kind, epochs, batch=32):
    """The digits model trained in this process on the batches the 2-rank run steps on
    together: DistributedSampler(seed=1) hands rank r every other index of the epoch's
    permutation from r on, so the ranks' k-th batches of 16 make up the permutation's
    k-th slice of 32."""
    import jitgrad
    data = digits.load_split()
    weights = digits.initial_weights([64, 128, 128, 10]) if kind == "mlp" else digits.cnn_weights()
    model, step, (xtr, ytr, xte, yte) = digits.setup(jitgrad, weights, data, 3e-3, kind)
    for epoch in range(epochs):
        order = jitgrad.randperm(len(xtr), generator=jitgrad.Generator().manual_seed(1 + epoch)).numpy()
        digits.run_epoch(jitgrad, step, xtr, ytr, order, batch)
    model.eval()
    with jitgrad.no_grad():
        return float((model(jitgrad.tensor(xte)).argmax(1).numpy() == yte).mean())


@needs_mpi
def test_a_batch_smaller_than_the_ranks_fails_every_rank_without_hanging(tmp_path):
    rc, _, err = run_job(2, "--epochs", "1", "--batch-size", "1", "--out", tmp_path, timeout=300)
    assert rc != 0 and "--batch-size 1 is smaller than the 2 ranks" in err, err[-3000:]


@pytest.mark.parametrize("flags,message", [(["--compile"], "--compile and --distributed"),
                                           (["--device", "cuda"], "--distributed trains on the CPU")])
def test_options_that_cannot_run_distributed_are_refused_before_any_work(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        digits.main(["--distributed", *flags])
    assert e.value.code == 2 and message in capsys.readouterr().err


def readme_loop():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text[text.index("## Distributed"):]
    return section[section.index("```python") + len("```python"):section.index("```", section.index("```python") + 3)]


@needs_mpi
@pytest.mark.parametrize("ranks", [2, None])
def test_the_readme_training_loop_runs(ranks, tmp_path):
    """Under mpiexec -n 2, and as a plain `python train.py` (one rank)."""
    script = tmp_path / "train.py"
    script.write_text(readme_loop())
    rc, out, err = run([sys.executable, script], ranks, cwd=tmp_path)
    assert rc == 0, f"stdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    losses = [float(v) for v in re.findall(r"^epoch \d: loss ([\d.]+)$", out, re.M)]
    assert len(losses) == 3 and losses[-1] < losses[0] and 0 < losses[-1] < 1.5, out  # rank 0 alone prints
