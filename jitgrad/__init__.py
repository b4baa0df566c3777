"""jitgrad: PyTorch's autograd on numpy, with a Numba-compiled backward engine.

The layers, each importing only those before it (README.md, "How a gradient travels"):
  _core/     the tape layout, dtypes, modes, version counters, PyTorch's messages
  kernels/   @njit backward kernels of the structural ops
  graph/     op specs, the tape and its recording, grad_fn views, the Tensor
  ops/       one module per op family: each primitive's forward beside its entry
  engine/    backward()/grad(), the compiled sweep and its generator, the Python executor
  autograd/  torch.autograd's public surface
"""
import importlib as _importlib

from jitgrad import autograd  # noqa: F401  (torch.autograd)
from jitgrad import ops as _ops  # noqa: F401  (the op table: binds Tensor methods)
from jitgrad._core.device import device, get_default_device, set_default_device
from jitgrad._core.dtype import bool_ as bool  # noqa: A004
from jitgrad._core.dtype import (
    cdouble,
    cfloat,
    complex64,
    complex128,
    double,
    dtype,
    float,
    float32,
    float64,
    get_default_dtype,
    int,
    int32,
    int64,
    long,
    set_default_dtype,
)
from jitgrad._core.modes import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from jitgrad.graph.interop import from_dlpack  # noqa: F401  (binds Tensor.__dlpack__ too)
from jitgrad.graph.random import Generator, randint, randperm  # noqa: F401
from jitgrad.graph.tensor import (
    Size,
    Tensor,
    arange,
    as_tensor,
    empty,
    empty_like,
    eye,
    from_numpy,
    full,
    full_like,
    linspace,
    logspace,
    manual_seed,
    ones,
    ones_like,
    rand,
    rand_like,
    randn,
    randn_like,
    tensor,
    zeros,
    zeros_like,
)
from jitgrad.graph.views import is_inference  # noqa: F401  (torch.is_inference)
from jitgrad.ops import FUNCTIONS as _FUNCTIONS
from jitgrad.ops.tensortypes import CPU_TYPES as _CPU_TYPES
from jitgrad.ops.tensortypes import set_default_tensor_type  # noqa: F401


def is_tensor(obj):
    return isinstance(obj, Tensor)


globals().update(_CPU_TYPES)  # torch.FloatTensor, DoubleTensor, LongTensor, IntTensor, BoolTensor
globals().update(_FUNCTIONS)  # jitgrad.<op>: the op table (ops/__init__.py), elementwise defop entries included
from jitgrad import linalg, nn, optim  # noqa: E402
from jitgrad._core.threads import default_threads as _default_threads  # noqa: E402
from jitgrad._core.threads import get_num_threads, set_num_threads  # noqa: E402
from jitgrad._core.verbosity import get_verbosity, set_verbosity  # noqa: E402

_default_threads()

for _alias, _op in (("multiply", "mul"), ("subtract", "sub"), ("divide", "div"), ("true_divide", "div"),
                   ("negative", "neg"), ("absolute", "abs"), ("concat", "cat"), ("concatenate", "cat")):
    globals()[_alias] = _FUNCTIONS[_op]

__version__ = "0.1.0"

# Loaded on first use, so that `import jitgrad` stays short: public name -> (module, attribute;
# None: the module itself). None of them registers anything the rest of the package needs
# (tests/package/test_startup.py checks that each stays unloaded, and that each resolves).
_LAZY = {
    "accelerator": ("jitgrad.accelerator", None),
    "install_as_torch": ("jitgrad.as_torch", "install_as_torch"),  # the import shim (jitgrad/as_torch.py)
    "uninstall_as_torch": ("jitgrad.as_torch", "uninstall_as_torch"),
    "backends": ("jitgrad.backends", None),
    "compile": ("jitgrad.compiler", "compile"),  # torch.compile
    "compiler": ("jitgrad.compiler", None),
    "cuda": ("jitgrad.cuda", None),
    "distributed": ("jitgrad.distributed", None),  # mpi4py itself is imported by its first use
    "func": ("jitgrad.func", None),
    "load": ("jitgrad.serialization", "load"),
    "random": ("jitgrad.random", None),  # torch.random (fork_rng, get_rng_state ...)
    "save": ("jitgrad.serialization", "save"),
    "serialization": ("jitgrad.serialization", None),
    "utils": ("jitgrad.utils", None),
    "viz": ("jitgrad.viz", None),  # graphviz itself is imported only by viz.make_dot
    "vmap": ("jitgrad.func", "vmap"),  # torch.vmap is torch.func.vmap
}


def _vmap():
    return __getattr__("func").vmap


# gradcheck's batched forward check needs vmap from a layer above autograd: wired here, at the top
# (the module: jitgrad.autograd.gradcheck the attribute is the function)
_importlib.import_module("jitgrad.autograd.gradcheck").vmap_provider = _vmap


def __getattr__(name):
    lazy = _LAZY.get(name)
    if lazy is not None:
        value = _importlib.import_module(lazy[0])
        if lazy[1] is not None:
            value = getattr(value, lazy[1])
        globals()[name] = value
        return value
    # an op declared after import (jitgrad.ops.defop) is jitgrad.<name> as well
    fn = _ops._common.PUBLIC.get(name)
    if fn is None:
        raise AttributeError(f"module 'jitgrad' has no attribute '{name}'")
    return fn


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
