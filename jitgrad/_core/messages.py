"""PyTorch's message texts, where more than one module raises them, and the shape and
type names those messages print."""
import numpy as np

# the legacy tensor type names torch prints in version-counter and hook messages
TENSOR_TYPES = {"float64": "torch.DoubleTensor", "float32": "torch.FloatTensor", "int64": "torch.LongTensor",
                "int32": "torch.IntTensor", "bool": "CPUBoolType"}


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
    kind = TENSOR_TYPES.get(np.asarray(data).dtype.name, "torch.Tensor")
    return RuntimeError(
        "one of the variables needed for gradient computation has been modified by an inplace operation: "
        f"[{kind} [{', '.join(str(n) for n in np.shape(data))}]] is at version {now}; expected version "
        f"{saved} instead. Hint: enable anomaly detection to find the operation that failed to compute its "
        "gradient, with torch.autograd.set_detect_anomaly(True).")
