"""nn.Module: parameters, submodules and buffers registered by attribute assignment, with
PyTorch's naming, state dicts, train/eval, forward hooks and repr."""
from collections import OrderedDict, namedtuple
from collections.abc import Mapping

import numpy as np

from jitgrad._core import device as _device
from jitgrad._core import dtype as _dtype
from jitgrad._core import modes as _grad_mode
from jitgrad._core.capture import generation as _generation
from jitgrad._core.capture import state as _cap
from jitgrad._core.messages import typename
from jitgrad.graph.hooks import add_hook
from jitgrad.graph.tensor import Tensor
from jitgrad.nn.init import _assign
from jitgrad.nn.parameter import Parameter


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    __slots__ = ()

    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


def _to_args(args, kwargs):
    """(device, dtype) of Module.to's arguments: to(device=None, dtype=None, non_blocking=False),
    to(dtype, non_blocking=False), to(tensor, non_blocking=False)."""
    dev, dt = kwargs.get("device"), kwargs.get("dtype")
    for a in args:
        if isinstance(a, _dtype.dtype):
            dt = a
        elif isinstance(a, Tensor):
            dev, dt = a.device, a.dtype
        elif not isinstance(a, bool):  # non_blocking: every copy here is synchronous
            dev = a
    if dt is not None and not isinstance(dt, _dtype.dtype):
        raise TypeError(f"to(): argument 'dtype' must be torch.dtype, not {type(dt).__name__}")
    return (None if dev is None else _device.check(dev, "to")), dt


class _Registry(OrderedDict):
    """A module's parameters, buffers or submodules: every change bumps the generation that
    jitgrad.compile's plans watch (compiler/guards.py), whoever makes it (__setattr__, the
    containers, _apply, code writing m._modules[k] itself). Reads cost what a dict's do."""
    __slots__ = ()

    # (the change first, then the bump: a guard that sees the new generation sees the change)
    def __setitem__(self, key, value):
        OrderedDict.__setitem__(self, key, value)
        _generation[0] += 1

    def __delitem__(self, key):
        OrderedDict.__delitem__(self, key)
        _generation[0] += 1

    def _bumped(name):  # noqa: N805  (a mutator of OrderedDict's that does not go through __setitem__)
        method = getattr(OrderedDict, name)

        def bumped(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            finally:
                _generation[0] += 1
        bumped.__name__ = name
        return bumped

    pop, popitem, clear, setdefault, update, move_to_end, __ior__ = map(
        _bumped, ("pop", "popitem", "clear", "setdefault", "update", "move_to_end", "__ior__"))
    del _bumped


_MISSING = object()


def _addindent(s, n):
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    return lines[0] + "\n" + "\n".join(" " * n + line for line in lines[1:])


def _check_name(module, kind, name, registered):
    """torch's checks of a name given to register_parameter / register_buffer / add_module."""
    if not isinstance(name, str):
        raise TypeError(f"{kind} name should be a string. Got {typename(name)}")
    if kind == "module" and hasattr(module, name) and name not in registered:  # torch checks this first for
        raise KeyError(f"attribute '{name}' already exists")                   # modules, last for the others
    if "." in name:
        raise KeyError(f'{kind} name can\'t contain "."' + (f", got: {name}" if kind == "module" else ""))
    if name == "":
        raise KeyError(f'{kind} name can\'t be empty string ""')
    if hasattr(module, name) and name not in registered:
        raise KeyError(f"attribute '{name}' already exists")


def _check_assign(module, name, value):
    """torch's TypeError for `module.name = value` where name is a registered parameter, child
    or buffer and value cannot take its place (a plain tensor for a parameter would otherwise
    drop it from parameters(), the optimizer and state_dict without a word). None empties the
    slot; a Parameter may replace anything, a Module anything but a parameter."""
    if value is None or isinstance(value, Parameter):
        return
    if name in module._parameters:
        raise TypeError(f"cannot assign '{typename(value)}' as parameter '{name}' (torch.nn.Parameter or None expected)")
    if isinstance(value, Module):
        return
    if name in module._modules:
        raise TypeError(f"cannot assign '{typename(value)}' as child module '{name}' "
                        "(torch.nn.Module or None expected)")
    if name in module._buffers and not isinstance(value, Tensor):
        raise TypeError(f"cannot assign '{typename(value)}' as buffer '{name}' "
                        "(torch.nn.Buffer, torch.Tensor or None expected)")


class Module:
    training = True

    def __init__(self):
        object.__setattr__(self, "_parameters", _Registry())
        object.__setattr__(self, "_buffers", _Registry())
        object.__setattr__(self, "_modules", _Registry())
        object.__setattr__(self, "_forward_hooks", {})
        object.__setattr__(self, "_forward_pre_hooks", {})
        object.__setattr__(self, "training", True)

    # -- registration ---------------------------------------------------------------
    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign before Module.__init__() call")
        _check_assign(self, name, value)
        for d in (self._parameters, self._modules, self._buffers):
            if name in d and not (d is self._parameters and isinstance(value, Parameter)) \
                    and not (d is self._modules and isinstance(value, Module)):
                if d is self._buffers and (value is None or isinstance(value, Tensor)):
                    d[name] = value
                    return
                if d is self._parameters and value is None:
                    d[name] = None
                    return
                del d[name]
        if isinstance(value, Parameter):
            self.__dict__.pop(name, None)  # a plain attribute of that name would hide it from reads
            self._parameters[name] = value
        elif isinstance(value, Module):
            self.__dict__.pop(name, None)
            self._modules[name] = value
        elif self.__dict__.get(name, _MISSING) is not value:  # (m.train() of a module in train mode: no change)
            object.__setattr__(self, name, value)
            _generation[0] += 1

    def __getattr__(self, name):
        d = self.__dict__
        for key in ("_parameters", "_buffers", "_modules"):
            if key in d and name in d[key]:
                return d[key][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for d in (self._parameters, self._buffers, self._modules):
            if name in d:
                del d[name]
                return
        object.__delattr__(self, name)
        _generation[0] += 1

    def register_parameter(self, name, param):
        _check_name(self, "parameter", name, self._parameters)
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{typename(param)}' object to parameter '{name}' "
                            "(torch.nn.Parameter or None required)")
        if param is not None and param.grad_fn is not None:
            raise ValueError(f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must be created "
                             f"explicitly. To express '{name}' as a function of another Tensor, compute the value in "
                             "the forward() method.")
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        _check_name(self, "buffer", name, self._buffers)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{typename(tensor)}' object to buffer '{name}' "
                            "(torch Tensor or None required)")
        self._buffers[name] = tensor
        # a non-persistent buffer moves with .to() but stays out of state_dict, as in torch
        skipped = self.__dict__.setdefault("_non_persistent_buffers_set", set())
        (skipped.discard if persistent else skipped.add)(name)

    def add_module(self, name, module):
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{typename(module)} is not a Module subclass")
        _check_name(self, "module", name, self._modules)
        self._modules[name] = module

    register_module = add_module

    # -- traversal ----------------------------------------------------------------
    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        if remove_duplicate:
            memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(memo, prefix + ("." if prefix else "") + name, remove_duplicate)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        seen = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self):
        for _, m in self.named_children():
            yield m

    def _named_members(self, kind, prefix="", recurse=True, remove_duplicate=True):
        """torch's walk: a tensor reached under several names (a tied weight) is yielded once,
        under its first name, unless remove_duplicate=False (then every name, every time)."""
        seen = set()
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for mprefix, m in mods:
            for name, v in getattr(m, kind).items():
                if v is None or id(v) in seen:
                    continue
                if remove_duplicate:
                    seen.add(id(v))
                yield mprefix + ("." if mprefix else "") + name, v

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def apply(self, fn):
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # -- modes and state ---------------------------------------------------------------
    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = bool(mode)
        for m in self.children():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        if _cap.on and _cap.mine():  # jitgrad.compile is recording: replayed as this same call
            return _cap.rec.call(Module.zero_grad, self, set_to_none)
        for p in self.parameters():
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    _assign(p.grad, 0)

    def _apply(self, fn):
        """fn applied to every parameter, gradient and buffer, as torch's Module._apply: a
        parameter stays the same object (its data is replaced, and its gradient's), a buffer
        is replaced by fn's result."""
        for m in self.modules():
            with _grad_mode.no_grad():
                for p in m._parameters.values():
                    if p is None:
                        continue
                    p.data = fn(p)
                    if p._grad is not None:
                        p._grad.data = fn(p._grad)
                for k, b in m._buffers.items():
                    if b is not None:
                        m._buffers[k] = fn(b)
        return self

    def to(self, *args, **kwargs):
        """to(device, dtype) / to(dtype) / to(tensor): parameters and buffers moved (and floating
        ones cast) in place, as torch's Module.to; returns self."""
        dev, dt = _to_args(args, kwargs)
        if dt is not None and dt.np.kind != "f":
            raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, but got desired dtype={dt}")
        return self._apply(lambda t: t.to(device=dev, dtype=dt if t.is_floating_point() else None))

    def cuda(self, device=None):
        return self._apply(lambda t: t.cuda(device))

    def cpu(self):
        return self._apply(lambda t: t.cpu())

    def float(self):
        return self._apply(lambda t: t.float() if t.is_floating_point() else t)

    def double(self):
        return self._apply(lambda t: t.double() if t.is_floating_point() else t)

    def _state(self, prefix=""):
        """(key, tensor) of what state_dict holds, in torch's order: each module's parameters,
        then its persistent buffers, then its children's, each under the key of every path that
        reaches it. No deduplication: a tied weight (GPT's lm_head.weight and wte.weight) has
        both keys, so that a torch checkpoint of it loads strictly."""
        out = []
        skipped = self.__dict__.get("_non_persistent_buffers_set", ())
        out.extend((prefix + k, p) for k, p in self._parameters.items() if p is not None)
        out.extend((prefix + k, b) for k, b in self._buffers.items() if b is not None and k not in skipped)
        for name, m in self._modules.items():
            if m is not None:
                out.extend(m._state(prefix + name + "."))
        return out

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        if args:  # torch's deprecated positional form: state_dict(destination, prefix, keep_vars)
            destination, prefix, keep_vars = (tuple(args) + (destination, prefix, keep_vars)[len(args):])[:3]
        out = OrderedDict() if destination is None else destination
        for name, t in self._state(prefix):
            out[name] = t if keep_vars else t.detach()
        return out

    def load_state_dict(self, state_dict, strict=True, assign=False):
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        own = OrderedDict(self._state())
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        errors = []
        if strict:  # (torch's order: missing keys, unexpected keys, then size mismatches)
            if missing:
                errors.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ". ")
            if unexpected:
                errors.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ". ")
        for k, t in own.items():
            if k in state_dict:
                v = state_dict[k]
                arr = v._data if isinstance(v, Tensor) else np.asarray(v)
                if tuple(arr.shape) != tuple(t._data.shape):
                    errors.append(f"size mismatch for {k}: copying a param with shape torch.Size({list(arr.shape)}) "
                                  f"from checkpoint, the shape in current model is torch.Size({list(t._data.shape)}).")
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(errors))
        with _grad_mode.no_grad():
            for k, t in own.items():
                if k in state_dict:
                    v = state_dict[k]
                    _assign(t, v._data if isinstance(v, Tensor) else np.asarray(v))  # across devices too
                    t._bump()
        return _IncompatibleKeys(missing, unexpected)

    # -- calling ---------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    def __call__(self, *args, **kwargs):
        if _cap.on and _cap.mine():  # jitgrad.compile: a replay is valid while this module's train/eval mode is
            _cap.rec.module(self)
        hooks = self._forward_pre_hooks.get(0)
        for hook in list(hooks.values()) if hooks else ():
            r = hook(self, args)
            if r is not None:
                args = r if isinstance(r, tuple) else (r,)
        out = self.forward(*args, **kwargs)
        hooks = self._forward_hooks.get(0)
        for hook in list(hooks.values()) if hooks else ():
            r = hook(self, args, out)
            if r is not None:
                out = r
        return out

    def register_forward_hook(self, hook):
        return add_hook(self._forward_hooks, 0, hook, watched=True)

    def register_forward_pre_hook(self, hook):
        return add_hook(self._forward_pre_hooks, 0, hook, watched=True)

    # -- printing ----------------------------------------------------------------------
    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [line for line in self.extra_repr().split("\n") if line]
        for name, m in self._modules.items():
            lines.append(f"({name}): " + _addindent(repr(m), 2))
        head = type(self).__name__ + "("
        if not self._modules:
            return head + "\n".join(lines) + ")" if len(lines) <= 1 else head + "\n  " + "\n  ".join(lines) + "\n)"
        return head + "\n  " + "\n  ".join(lines) + "\n)"
