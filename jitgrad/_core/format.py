"""repr/str of tensors, following PyTorch's printing rules for the common cases."""
import numpy as np


def _fmt_floats(vals):
    finite = vals[np.isfinite(vals)]
    if finite.size == 0:
        return lambda v: _special(v) or f"{v:.4f}", 4
    absf = np.abs(finite)
    nz = absf[absf > 0]
    ints = np.all(finite == np.round(finite))
    if ints and (absf.max() if absf.size else 0) < 1e8:
        return (lambda v: _special(v) or f"{v:.0f}."), None
    if nz.size and (nz.max() / nz.min() > 1000.0 or nz.max() > 1e8 or nz.min() < 1e-4):
        return (lambda v: _special(v) or f"{v:.4e}"), None
    return (lambda v: _special(v) or f"{v:.4f}"), None


def _special(v):
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return None


def _body(arr):
    if arr.size == 0:
        return "[]"
    if arr.dtype.kind == "f":
        fmt, _ = _fmt_floats(arr.astype(np.float64).ravel())
        strs = [fmt(float(v)) for v in arr.ravel()]
    elif arr.dtype.kind == "b":
        strs = ["True" if v else "False" for v in arr.ravel()]
    else:
        strs = [str(int(v)) for v in arr.ravel()]
    width = max(len(s) for s in strs)
    strs = [s.rjust(width) for s in strs]
    if arr.ndim == 0:
        return strs[0].strip()
    return _nest(strs, arr.shape, 0, 8)


def _nest(strs, shape, pos, indent):
    if len(shape) == 1:
        # torch's _vector_str: as many elements per line as fit in 80 columns
        row = strs[pos:pos + shape[0]]
        per_line = max(1, (80 - (indent - 1)) // (len(row[0]) + 2)) if row else 1
        lines = [", ".join(row[i:i + per_line]) for i in range(0, len(row), per_line)]
        return "[" + (",\n" + " " * indent).join(lines) + "]"
    step = int(np.prod(shape[1:]))
    parts = [_nest(strs, shape[1:], pos + i * step, indent + 1) for i in range(shape[0])]
    sep = "," + "\n" * (len(shape) - 1) + " " * indent
    return "[" + sep.join(parts) + "]"


def tensor_repr(t):
    arr = t._data
    extras = []
    if not isinstance(arr, (np.ndarray, np.generic)):  # a CUDA tensor: printed from a host copy, as torch does
        arr = arr.get()
        extras.append(f"device='{t.device}'")
    if arr.dtype not in (np.float32, np.int64, np.bool_):
        extras.append(f"dtype={t.dtype!r}")
    elif arr.size == 0 and arr.dtype != np.float32:
        extras.append(f"dtype={t.dtype!r}")
    if arr.size == 0 and arr.shape != (0,):
        extras.insert(0, f"size={tuple(arr.shape)}")
    try:
        name = None if t.grad_fn is None else t.grad_fn.name()
    except RuntimeError:  # a view whose base was modified in place where that is forbidden
        name = "Invalid"
    if name is not None:
        extras.append(f"grad_fn=<{name}>")
    elif t.requires_grad:
        extras.append("requires_grad=True")
    tangent = None if t._x is None else t._x.fw  # forward AD, at the open dual level
    if tangent is not None:
        extras.append("tangent=" + tensor_repr(tangent))
    text = "tensor(" + _body(arr)
    # torch's _add_suffixes: a suffix that would pass 80 columns goes on a line of its own
    last = len(text) - text.rfind("\n") + 1
    for e in extras:
        if last + len(e) + 2 > 80:
            text += ",\n" + " " * len("tensor(") + e
            last = len("tensor(") + len(e)
        else:
            text += ", " + e
            last += len(e) + 2
    return text + ")"
