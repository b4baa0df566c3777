"""Moving data between devices: `.to(device)`, `.cuda()`, `.cpu()` as one primitive.

PyTorch records a device copy as ToCopyBackward0, whose backward copies the gradient
back to the input's device; so does this op. The copy itself is a host <-> device
transfer (gpu/array.py), synchronous as PyTorch's default. A copy to the meta device
keeps the shape and dtype (_core/meta.py); a copy out of it raises, as in torch.
"""
import numpy as np

from jitgrad._core import device as _device
from jitgrad._core.capture import state as _cap
from jitgrad._core.capture import stop as _stop
from jitgrad._core.meta import NO_DATA, MetaArray
from jitgrad.gpu.array import DeviceArray
from jitgrad.graph.record import record
from jitgrad.graph.spec import structural
from jitgrad.graph.tensor import place
from jitgrad.graph.tensor import wrap as _wrap
from jitgrad.ops._common import _needs

_FROM_CUDA = 1  # the row's int param: where the input was (0: cpu)


def to_device(x, dev):
    """x on the (checked) device `dev`; x itself when it is there already."""
    if x.device == dev:
        return x
    if _cap.on and _cap.mine():
        _stop(f"a copy to {dev} (jitgrad.compile replays on one device)")
    d = x._data
    if type(d) is MetaArray or dev.type == "meta":
        return _to_meta(x, dev)
    on_cuda = type(d) is DeviceArray
    res = _wrap(d.get() if on_cuda else place(np.asarray(d), dev))  # from_host makes it contiguous, 0-d kept
    if _needs(x):
        return record(TO_DEVICE, res, (x,), (), (), [_FROM_CUDA if on_cuda else 0])
    return res


def _to_meta(x, dev):
    """A copy onto the meta device keeps the shape and dtype only; nothing comes back out.
    torch records the copy (ToCopyBackward0); a meta gradient could never be computed here,
    so a copy that autograd would record is refused rather than silently detached."""
    if type(x._data) is MetaArray:
        raise NotImplementedError(NO_DATA)
    if _needs(x):
        raise NotImplementedError("jitgrad cannot record a copy to the meta device for autograd: move the tensor "
                                  "under torch.no_grad() or detach() it first (Module.to('meta') does)")
    return _wrap(MetaArray.like(x._data))


def to_device_rule(grad, ri):
    (where,) = ri.iparams()
    return (to_device(grad, _device.CUDA if where == _FROM_CUDA else _device.CPU),)


def to_device_jvp(ci, tangents):
    return to_device(tangents[0], ci.result.device)


TO_DEVICE = structural("to_device", "ToCopyBackward0", rule=to_device_rule, iparams=("from_cuda",),
                       forward=to_device, jvp=to_device_jvp)
