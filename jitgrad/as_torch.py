"""The import shim: `import torch` resolves to jitgrad, so a library written against PyTorch runs unmodified.

Two ways in, both explicit:

    python -m jitgrad.as_torch script.py args...     # like `python script.py args...`
    python -m jitgrad.as_torch -m package.module args...

    import jitgrad
    with jitgrad.install_as_torch():                  # or a bare call, undone by uninstall_as_torch()
        import torchdiffeq                            # its `import torch` is jitgrad

While installed, `torch` is a small module object that forwards every attribute to `jitgrad` (so
`torch.Tensor is jitgrad.Tensor`) and says what it is: `torch.__version__` is "2.13.0+jitgrad", a
TorchVersion-style string that compares like torch's (`torch.__version__ >= "1.8"`), and
`torch.jitgrad_version` is jitgrad's own `__version__`. `torch.X.Y` imports `jitgrad.X.Y`, the same module
object, so `torch.nn.functional is jitgrad.nn.functional`. A submodule that jitgrad lacks raises
ModuleNotFoundError saying so (a library that guards the import with `except ImportError` goes on).

Installing takes any real `torch*` entries out of `sys.modules` and puts a finder first on `sys.meta_path`;
uninstalling removes the finder and the shim's `torch*` entries and puts the saved real ones back. Modules
imported while the shim was installed keep the jitgrad objects they bound.
"""
import importlib
import importlib.abc
import importlib.machinery
import os
import runpy
import sys
import types

import jitgrad

# the PyTorch release whose API jitgrad follows (the oracle of the test suite)
TORCH_API_VERSION = "2.13.0"


def _release(text):
    """A sort key of a PEP 440 version string, enough to order torch versions: (release numbers, pre/post
    rank, local part). As PEP 440: 2.0.0.dev < 2.0.0a0 < 2.0.0b1 < 2.0.0rc1 < 2.0.0 < 2.0.0+cpu < 2.0.0.post1."""
    public, _, local = str(text).strip().lower().lstrip("v").partition("+")
    nums, rest = [], ""
    for part in public.split("."):
        digits = len(part) - len(part.lstrip("0123456789"))
        if not digits:
            rest = part
            break
        nums.append(int(part[:digits]))
        rest = part[digits:]
        if rest:
            break
    while len(nums) > 1 and nums[-1] == 0:
        nums.pop()
    rank = (("post", 5), ("dev", 0), ("alpha", 1), ("beta", 2), ("rc", 3), ("a", 1), ("b", 2), ("c", 3))
    tag = next((r for t, r in rank if rest.startswith(t)), 4)
    return tuple(nums), tag, local


class TorchVersion(str):
    """A version string that compares as a version, like torch.torch_version.TorchVersion: against a
    string ("1.8", "2.0.0a0"), a tuple ((1, 8)) or another version. As PEP 440 (and torch), the local part
    sorts after the same public version: "2.13.0+jitgrad" > "2.13.0", and != "2.13.0"."""

    def _key(self, other):
        if isinstance(other, tuple):
            other = ".".join(str(x) for x in other)
        if not isinstance(other, str):
            other = str(other)
        return _release(self), _release(other)

    def __lt__(self, other):
        a, b = self._key(other)
        return a < b

    def __le__(self, other):
        a, b = self._key(other)
        return a <= b

    def __gt__(self, other):
        a, b = self._key(other)
        return a > b

    def __ge__(self, other):
        a, b = self._key(other)
        return a >= b

    def __eq__(self, other):
        a, b = self._key(other)
        return a == b

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


__version__ = TorchVersion(f"{TORCH_API_VERSION}+jitgrad")


class _TorchModule(types.ModuleType):
    """`torch` while the shim is installed: its own name and version, every other attribute jitgrad's.
    Attributes a library sets on it stay on it (jitgrad's own namespace is not changed)."""

    def __getattr__(self, name):
        return getattr(jitgrad, name)

    def __dir__(self):
        return sorted(set(dir(jitgrad)) | set(self.__dict__))

    def __repr__(self):
        return f"<module 'torch' (jitgrad {jitgrad.__version__} import shim) from {jitgrad.__file__!r}>"


def _version_module():
    """torch.version: what libraries read to learn the build (no CUDA/HIP toolkit built in)."""
    mod = types.ModuleType("torch.version", "PyTorch version information, answered by jitgrad's import shim.")
    mod.__version__ = __version__
    mod.cuda = None
    mod.hip = None
    mod.debug = False
    mod.git_version = f"jitgrad-{jitgrad.__version__}"
    mod.jitgrad_version = jitgrad.__version__
    return mod


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Maps `torch.a.b` to the already importable `jitgrad.a.b` and hands back that very module object."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("torch."):
            return None
        target_name = "jitgrad" + fullname[len("torch"):]
        try:
            module = importlib.import_module(target_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and exc.name != target_name and not target_name.startswith(exc.name + "."):
                raise  # jitgrad.a.b exists but imports something missing: that is the real error
            parent, _, leaf = target_name.rpartition(".")
            module = getattr(sys.modules.get(parent), leaf, None)
            if not isinstance(module, types.ModuleType):
                raise ModuleNotFoundError(
                    f"No module named '{fullname}': jitgrad's import shim (jitgrad.install_as_torch) is active, "
                    f"and jitgrad does not provide {fullname}", name=fullname) from None
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=getattr(module, "__file__", None),
                                              is_package=hasattr(module, "__path__"))
        if spec.submodule_search_locations is not None:
            spec.submodule_search_locations = list(module.__path__)
        spec.jitgrad_module = module
        return spec

    def create_module(self, spec):
        module = spec.jitgrad_module
        spec.jitgrad_saved_spec = module.__spec__
        return module

    def exec_module(self, module):
        # the import system stamped the torch.* spec on jitgrad's module: give it its own back
        module.__spec__ = module.__spec__.jitgrad_saved_spec


class _Installation:
    """What one install_as_torch() changed; undone by uninstall() (or leaving the `with` block)."""

    def __init__(self):
        self.finder = _Finder()
        self.saved = {}
        self.active = False

    def install(self):
        self.saved = {k: m for k, m in sys.modules.items() if k == "torch" or k.startswith("torch.")}
        for k in self.saved:
            del sys.modules[k]
        torch = _TorchModule("torch", jitgrad.__doc__)
        torch.__file__ = jitgrad.__file__
        torch.__path__ = list(jitgrad.__path__)
        torch.__spec__ = importlib.machinery.ModuleSpec("torch", self.finder, origin=jitgrad.__file__,
                                                        is_package=True)
        torch.__spec__.submodule_search_locations = list(jitgrad.__path__)
        torch.__loader__ = self.finder
        torch.__package__ = "torch"
        torch.__version__ = __version__
        torch.jitgrad_version = jitgrad.__version__
        torch.version = _version_module()
        sys.modules["torch"] = torch
        sys.modules["torch.version"] = torch.version
        sys.meta_path.insert(0, self.finder)
        self.active = True
        return self

    def uninstall(self):
        if not self.active:
            return
        self.active = False
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        for k in [k for k in sys.modules if k == "torch" or k.startswith("torch.")]:
            del sys.modules[k]
        sys.modules.update(self.saved)
        self.saved = {}
        if _state["current"] is self:
            _state["current"] = None

    def __enter__(self):
        return sys.modules["torch"]

    def __exit__(self, *exc):
        self.uninstall()
        return False


_state = {"current": None}


def install_as_torch():
    """Make `import torch` (and every `torch.<submodule>` jitgrad has) resolve to jitgrad until
    uninstall_as_torch(). Returns a context manager that uninstalls on exit; `with` gives the `torch`
    module. Installing again while installed returns the current installation unchanged."""
    current = _state["current"]
    if current is not None and current.active:
        return current
    _state["current"] = _Installation().install()
    return _state["current"]


def uninstall_as_torch():
    """Undo install_as_torch(): the shim's torch modules leave sys.modules, any real torch modules that
    were imported before it come back. Does nothing when the shim is not installed."""
    current = _state["current"]
    if current is not None:
        current.uninstall()


def is_installed():
    current = _state["current"]
    return current is not None and current.active


USAGE = """usage: python -m jitgrad.as_torch script.py [args...]
       python -m jitgrad.as_torch -m module [args...]

Runs a PyTorch program with `import torch` resolving to jitgrad (jitgrad's import shim)."""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    install_as_torch()
    if argv[0] == "-m":
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        # as `python -m module`: the current directory first on the path, argv[0] the module's file
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        # as `python script.py`: the script's folder first on the path
        sys.argv = argv
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    # run through the importable module, so that jitgrad.as_torch seen by the script is this same state
    sys.exit(importlib.import_module("jitgrad.as_torch").main())
