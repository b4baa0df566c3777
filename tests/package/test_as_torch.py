"""jitgrad's import shim (jitgrad/as_torch.py): `import torch` resolves to jitgrad while installed, every
torch.<submodule> jitgrad has is jitgrad's module object, a missing one says it is not provided by jitgrad,
the version says it is jitgrad's and compares like torch's, and uninstalling restores real torch."""
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

import jitgrad
from jitgrad import as_torch

SUBMODULES = ["nn", "nn.functional", "nn.init", "utils", "utils.data", "func", "autograd", "autograd.functional",
              "autograd.forward_ad", "linalg", "optim", "cuda", "backends", "distributed", "compiler"]


@pytest.fixture
def shim():
    with jitgrad.install_as_torch() as torch:
        yield torch
    assert not as_torch.is_installed()


def test_import_torch_is_jitgrad(shim):
    import torch
    assert torch is shim and torch.Tensor is jitgrad.Tensor and torch.ones is jitgrad.ones
    assert "jitgrad" in repr(torch)
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    assert isinstance(x, jitgrad.Tensor) and x.grad.tolist() == [2.0, 4.0]


@pytest.mark.parametrize("name", SUBMODULES)
def test_submodule_is_jitgrads_module(shim, name):
    import importlib
    mod = importlib.import_module("torch." + name)
    assert mod is importlib.import_module("jitgrad." + name)
    assert mod.__spec__.name == "jitgrad." + name  # jitgrad's module keeps its own identity
    assert sys.modules["torch." + name] is mod


def test_from_imports(shim):
    from torch.autograd import grad
    from torch.nn import functional as F
    from torch.utils.data import DataLoader
    assert grad is jitgrad.autograd.grad and F is jitgrad.nn.functional and DataLoader is jitgrad.utils.data.DataLoader


def test_missing_submodule_names_jitgrad(shim):
    with pytest.raises(ModuleNotFoundError, match=r"No module named 'torch.distributions'.*jitgrad does not provide "
                                                  r"torch.distributions") as err:
        import torch.distributions  # noqa: F401
    assert err.value.name == "torch.distributions"
    with pytest.raises(ImportError, match="jitgrad does not provide torch.nn.no_such_module"):
        import torch.nn.no_such_module  # noqa: F401


def test_version_is_jitgrads_and_compares(shim):
    import torch
    import torch.version
    assert torch.__version__ == "2.13.0+jitgrad" and str(torch.__version__).endswith("+jitgrad")
    assert torch.jitgrad_version == jitgrad.__version__ == torch.version.jitgrad_version
    assert jitgrad.__version__ != torch.__version__  # jitgrad's own version stays its own
    v = torch.__version__
    assert v >= "1.8" and v >= "2.13" and v > "2.12.1" and v < "2.14" and v < "3" and v >= (2, 0) and v < (2, 14)
    assert v > "2.13.0rc1" and v > "2.13.0.dev20250101" and v > "2.13.0" and v != "2.13.0" and v < "2.13.0.post1"
    assert v == "2.13.0+jitgrad" and v == "v2.13+jitgrad" and hash(v) == hash("2.13.0+jitgrad")
    assert not v >= "2.14.0a0"
    assert torch.version.cuda is None and torch.version.__version__ == v


def test_uninstall_restores_real_torch():
    real = pytest.importorskip("torch")
    import torch.nn
    real_nn = sys.modules["torch.nn"]
    handle = jitgrad.install_as_torch()
    try:
        assert jitgrad.install_as_torch() is handle  # installing twice: the same installation
        import torch as shimmed
        import torch.nn
        assert shimmed is not real and shimmed.nn is jitgrad.nn and sys.modules["torch.nn"] is jitgrad.nn
        assert as_torch._state["current"].finder in sys.meta_path
    finally:
        jitgrad.uninstall_as_torch()
    assert sys.modules["torch"] is real and sys.modules["torch.nn"] is real_nn
    assert not any(isinstance(f, as_torch._Finder) for f in sys.meta_path)
    import torch as again
    assert again is real
    jitgrad.uninstall_as_torch()  # a second uninstall does nothing
    assert sys.modules["torch"] is real


def test_context_manager_uninstalls_on_error():
    before = sys.modules.get("torch")
    with pytest.raises(ZeroDivisionError):
        with jitgrad.install_as_torch():
            1 / 0
    assert sys.modules.get("torch") is before and not as_torch.is_installed()


def _run(args, tmp_path):
    env_path = ROOT
    return subprocess.run([sys.executable, "-m", "jitgrad.as_torch", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env={**__import__("os").environ, "PYTHONPATH": env_path})


SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import torch.nn.functional as F
    import jitgrad
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    F.relu(x).sum().backward()
    print(__name__, sys.argv[1:], torch.__version__, torch.Tensor is jitgrad.Tensor, x.grad.tolist())
""")


def test_python_m_as_torch_runs_a_script(tmp_path):
    (tmp_path / "prog.py").write_text(SCRIPT)
    out = _run(["prog.py", "a", "--b"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "__main__ ['a', '--b'] 2.13.0+jitgrad True [1.0, 0.0]"


def test_python_m_as_torch_runs_a_module(tmp_path):
    (tmp_path / "pkgmod").mkdir()
    (tmp_path / "pkgmod" / "__init__.py").write_text("")
    (tmp_path / "pkgmod" / "main.py").write_text(SCRIPT)
    out = _run(["-m", "pkgmod.main", "x"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "__main__ ['x'] 2.13.0+jitgrad True [1.0, 0.0]"


def test_python_m_as_torch_usage_and_errors(tmp_path):
    out = _run([], tmp_path)
    assert out.returncode == 2 and "usage: python -m jitgrad.as_torch" in out.stdout
    (tmp_path / "bad.py").write_text("import torch.distributions\n")
    out = _run(["bad.py"], tmp_path)
    assert out.returncode == 1 and "jitgrad does not provide torch.distributions" in out.stderr
