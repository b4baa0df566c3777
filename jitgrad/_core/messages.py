"""PyTorch's message texts, where more than one module raises them, and the shape and
type names those messages print."""
import numpy as np


def size_str(shape):
    """A shape as torch prints a list of sizes: [2, 3]."""
    return f"[{', '.join(str(s) for s in shape)}]"


def torch_size(shape):
    """A shape as torch prints a torch.Size: torch.Size([2, 3])."""
    return f"torch.Size({size_str(shape)})"


def freed_error():
    return RuntimeError(
        "Trying to backward through the graph a second time (or directly access saved tensors after they have "
        "already been freed). Saved intermediate values of the graph are freed when you call .backward() or "
        "autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or "
        "if you need to access saved tensors after calling backward.")


def modified_error(data, now, saved):
    """A saved value was written in place after it was saved (its version moved on)."""
    d = data.dtype  # an ndarray, a numpy scalar or a CUDA array (gpu/array.py), which np.asarray refuses
    cuda = getattr(data, "device", "cpu") != "cpu"
    if d == np.bool_:  # torch's own name for bool here
        kind = "CUDABoolType" if cuda else "CPUBoolType"
    else:
        kind = tensor_type(d).replace("torch.", "torch.cuda.") if cuda else tensor_type(d)
    return RuntimeError(
        "one of the variables needed for gradient computation has been modified by an inplace operation: "
        f"[{kind} [{', '.join(str(n) for n in data.shape)}]] is at version {now}; expected version "
        f"{saved} instead. Hint: enable anomaly detection to find the operation that failed to compute its "
        "gradient, with torch.autograd.set_detect_anomaly(True).")


# torch's names of each dtype, by numpy name: (scalar type, C++ type, legacy tensor type).
# Which one a message prints depends on the message: each caller says which it wants.
_DTYPE_NAMES = {
    "float64": ("Double", "double", "DoubleTensor"),
    "float32": ("Float", "float", "FloatTensor"),
    "float16": ("Half", "c10::Half", "HalfTensor"),
    "complex128": ("ComplexDouble", "c10::complex<double>", "ComplexDoubleTensor"),
    "complex64": ("ComplexFloat", "c10::complex<float>", "ComplexFloatTensor"),
    "int64": ("Long", "long int", "LongTensor"),
    "int32": ("Int", "int", "IntTensor"),
    "int16": ("Short", "short int", "ShortTensor"),
    "int8": ("Char", "signed char", "CharTensor"),
    "uint8": ("Byte", "unsigned char", "ByteTensor"),
    "bool": ("Bool", "bool", "BoolTensor"),
}


def scalar_name(dtype):
    """'Double', 'Long': the ScalarType name ("not implemented for 'Long'")."""
    name = np.dtype(dtype).name
    return _DTYPE_NAMES.get(name, (name,))[0]


def c_name(dtype):
    """'double', 'long int': the C++ type name some messages print."""
    name = np.dtype(dtype).name
    return _DTYPE_NAMES[name][1] if name in _DTYPE_NAMES else name


def tensor_type(dtype):
    """'torch.DoubleTensor': the legacy tensor type name."""
    name = np.dtype(dtype).name
    return "torch." + (_DTYPE_NAMES[name][2] if name in _DTYPE_NAMES else name)


NONLEAF_GRAD_WARNING = (
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad attribute won't be "
    "populated during autograd.backward(). If you indeed want the .grad field to be populated for a non-leaf "
    "Tensor, use .retain_grad() on the non-leaf Tensor. If you access the non-leaf Tensor by mistake, make sure "
    "you access the leaf Tensor instead. See github.com/pytorch/pytorch/pull/30531 for more information.")


def typename(obj):
    """torch.typename: 'torch.FloatTensor' (torch.cuda.* on a GPU) for a tensor, 'int' for a
    builtin, 'module.Class' otherwise: how torch's argument errors name what they were given."""
    data = getattr(obj, "_data", None)
    if data is not None and hasattr(obj, "grad_fn"):  # a Tensor (no import: this module is below it)
        name = tensor_type(data.dtype)
        return name if getattr(data, "device", "cpu") == "cpu" else name.replace("torch.", "torch.cuda.", 1)
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ in ("", "builtins") else f"{cls.__module__}.{cls.__qualname__}"
