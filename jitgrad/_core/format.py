"""repr/str of tensors, following PyTorch's printing rules for the common cases, with
torch.set_printoptions' precision, sci_mode, threshold, edgeitems and linewidth."""
import numpy as np

from jitgrad._core.meta import MetaArray

_DEFAULTS = {"precision": 4, "threshold": 1000, "edgeitems": 3, "linewidth": 80, "sci_mode": None}
_PROFILES = {"default": _DEFAULTS, "short": dict(_DEFAULTS, precision=2, threshold=1000, edgeitems=2),
             "full": dict(_DEFAULTS, threshold=np.inf)}
OPTIONS = dict(_DEFAULTS)


def set_printoptions(precision=None, threshold=None, edgeitems=None, linewidth=None, profile=None,
                     sci_mode=None):
    """torch.set_printoptions: a profile first, then the options given; sci_mode is always
    set (None: chosen from the values, as torch)."""
    if profile is not None:
        OPTIONS.update(_PROFILES[profile])
    for name, value in (("precision", precision), ("threshold", threshold), ("edgeitems", edgeitems),
                        ("linewidth", linewidth)):
        if value is not None:
            OPTIONS[name] = value
    OPTIONS["sci_mode"] = sci_mode


def _fmt_floats(vals):
    p = OPTIONS["precision"]
    sci = OPTIONS["sci_mode"]
    finite = vals[np.isfinite(vals)]
    if finite.size == 0:
        return lambda v: _special(v) or f"{v:.{p}f}"
    absf = np.abs(finite)
    nz = absf[absf > 0]
    ints = np.all(finite == np.round(finite))
    if ints and (absf.max() if absf.size else 0) < 1e8 and not sci:
        return lambda v: _special(v) or f"{v:.0f}."
    wide = nz.size and (nz.max() / nz.min() > 1000.0 or nz.max() > 1e8 or (nz.min() < 1e-4 and not ints))
    if sci or (sci is None and wide):
        return lambda v: _special(v) or f"{v:.{p}e}"
    return lambda v: _special(v) or f"{v:.{p}f}"


def _special(v):
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return None


def _summarized(arr, edge):
    """The elements printed when the tensor is summarized: edge items each side of every dim."""
    for d in range(arr.ndim):
        if arr.shape[d] > 2 * edge:
            arr = np.concatenate([np.take(arr, range(edge), d), np.take(arr, range(arr.shape[d] - edge,
                                                                                     arr.shape[d]), d)], d)
    return arr


def _body(arr):
    if arr.size == 0:
        return "[]"
    summarize = arr.size > OPTIONS["threshold"]
    shown = _summarized(arr, OPTIONS["edgeitems"]) if summarize else arr
    if arr.dtype.kind == "f":
        fmt = _fmt_floats(shown.astype(np.float64).ravel())
    elif arr.dtype.kind == "b":
        def fmt(v):
            return "True" if v else "False"
    else:
        def fmt(v):
            return str(int(v))
    width = max(len(fmt(v.item())) for v in shown.ravel())
    if arr.ndim == 0:
        return fmt(arr.item())
    return _nest(arr, lambda v: fmt(v.item()).rjust(width), width, 8, summarize)


def _nest(arr, fmt, width, indent, summarize):
    edge = OPTIONS["edgeitems"]
    cut = summarize and arr.shape[0] > 2 * edge
    if arr.ndim == 1:
        if cut:
            strs = [fmt(v) for v in arr[:edge]] + [" ..."] + [fmt(v) for v in arr[-edge:]]
        else:
            strs = [fmt(v) for v in arr]
        # torch's _vector_str: as many elements per line as fit in linewidth columns
        per_line = max(1, int((OPTIONS["linewidth"] - (indent - 1)) // (width + 2)))
        lines = [", ".join(strs[i:i + per_line]) for i in range(0, len(strs), per_line)]
        return "[" + (",\n" + " " * indent).join(lines) + "]"
    rows = range(arr.shape[0])
    if cut:
        parts = [_nest(arr[i], fmt, width, indent + 1, summarize) for i in rows[:edge]] + ["..."] + \
                [_nest(arr[i], fmt, width, indent + 1, summarize) for i in rows[-edge:]]
    else:
        parts = [_nest(arr[i], fmt, width, indent + 1, summarize) for i in rows]
    sep = "," + "\n" * (arr.ndim - 1) + " " * indent
    return "[" + sep.join(parts) + "]"


def tensor_repr(t):
    arr = t._data
    extras = []
    meta = type(arr) is MetaArray
    if meta:  # no values to print: torch's "..." and the size, and the dtype unless float32
        extras += ["device='meta'", f"size={arr.shape}"]
        if arr.dtype != np.float32:
            extras.append(f"dtype={t.dtype!r}")
    else:
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
    text = "tensor(" + ("..." if meta else _body(arr))
    # torch's _add_suffixes: a suffix that would pass 80 columns goes on a line of its own
    last = len(text) - text.rfind("\n") + 1
    for e in extras:
        if last + len(e) + 2 > OPTIONS["linewidth"]:
            text += ",\n" + " " * len("tensor(") + e
            last = len("tensor(") + len(e)
        else:
            text += ", " + e
            last += len(e) + 2
    return text + ")"
