"""The README's main job (python -m jitgrad.examples.digits), in a short mode."""
import os

import numpy as np
import pytest

pytest.importorskip("sklearn")
from jitgrad.examples import digits  # noqa: E402


def test_digits_short_run_learns_and_writes_outputs(tmp_path, capsys):
    accs = digits.main(["--epochs", "3", "--no-progress", "--no-torch", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    # 3 epochs reach ~95% (MLP) and ~90% (CNN); chance is 10%
    assert accs["mlp"] > 0.9 and accs["cnn"] > 0.8, out
    assert out.count("test accuracy") == 2
    for kind, node in (("mlp", "AddmmBackward0"), ("cnn", "ConvolutionBackward0")):
        try:
            import matplotlib  # noqa: F401
            assert os.path.getsize(tmp_path / f"{kind}_loss_curve.png") > 1000
        except ImportError:
            assert "loss curve: skipped" in out
        graphs = [p for p in os.listdir(tmp_path) if p.startswith(f"{kind}_graph")]
        try:
            import graphviz  # noqa: F401
            assert graphs, out
            text = open(tmp_path / graphs[0]).read()
            assert node in text and "0.weight" in text
        except ImportError:
            assert "model graph: skipped" in out


def test_digits_matches_torch_loss_for_loss():
    """Same initial weights, same batches: the jitgrad run follows PyTorch's losses."""
    torch = pytest.importorskip("torch")
    import jitgrad
    data = digits.load_split()
    weights = digits.initial_weights([64, 32, 10])
    _, lj, _, aj = digits.train(jitgrad, weights, data, 1, 32, 3e-3, progress=False)
    _, lt, _, at = digits.train(torch, weights, data, 1, 32, 3e-3, progress=False)
    np.testing.assert_allclose(lj, lt, rtol=1e-4)
    assert aj == pytest.approx(at, abs=0.01)


def test_digits_cnn_follows_torch():
    torch = pytest.importorskip("torch")
    import jitgrad
    data = digits.load_split()
    w = digits.cnn_weights()
    _, lj, _, _ = digits.train(jitgrad, w, data, 1, 32, 3e-3, progress=False, kind="cnn")
    _, lt, _, _ = digits.train(torch, w, data, 1, 32, 3e-3, progress=False, kind="cnn")
    np.testing.assert_allclose(lj, lt, rtol=1e-3)
