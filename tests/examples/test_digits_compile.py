"""The digits main job with --compile: the compiled step trains as the eager one does."""
import numpy as np
import pytest

pytest.importorskip("sklearn")
import jitgrad  # noqa: E402
from jitgrad.examples import digits  # noqa: E402


def test_compiled_training_follows_eager_loss_for_loss():
    """Same weights, same batches (the last one smaller: a second signature): float32
    replay equals eager jitgrad to 1e-5, step by step, two epochs."""
    data = digits.load_split()
    weights = digits.initial_weights([64, 32, 10])
    _, eager, _, acc = digits.train(jitgrad, weights, data, 2, 32, 3e-3, progress=False)
    _, compiled, _, cacc = digits.train(jitgrad, weights, data, 2, 32, 3e-3, progress=False, compiled=True)
    assert len(compiled) == len(eager) == 2 * -(-len(data[0]) // 32)
    np.testing.assert_allclose(compiled, eager, rtol=1e-5)
    assert cacc == pytest.approx(acc, abs=1e-9)


def test_compile_flag_prints_the_compiled_epoch_beside_eager(tmp_path, capsys):
    digits.main(["--epochs", "2", "--model", "mlp", "--hidden", "32", "--no-progress", "--no-torch", "--compile",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    lines = out.splitlines()
    compiled = [ln for ln in lines if ln.startswith("compiled test accuracy")]
    assert len(compiled) == 1 and "epoch time compiled/eager:" in compiled[0], out
    assert any(ln.strip().startswith("jitgrad.compile: ") for ln in lines), out
    diff = next(ln for ln in lines if "losses compiled vs eager" in ln)
    assert float(diff.rsplit(" ", 1)[1]) <= 1e-5, diff


def test_default_run_has_no_compiled_line(tmp_path, capsys):
    digits.main(["--epochs", "1", "--model", "mlp", "--hidden", "16", "--no-progress", "--no-torch",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "compiled" not in out and "jitgrad.compile" not in out, out
