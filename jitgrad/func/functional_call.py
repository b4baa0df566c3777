"""torch.func.functional_call: run a Module with some of its parameters and buffers
replaced by the given tensors, as torch.nn.utils.stateless does; and stack_module_state,
which makes those tensors for an ensemble of same-class modules (one stacked tensor per
name, the model index first) to vmap functional_call over.

The tensors are swapped into the modules' `_parameters` / `_buffers` dicts (or set as
attributes) for the call and the originals swapped back afterwards, also when the call
raises. Names are dotted paths ("0.weight", "layer.1.bias"); a tensor tied under several
names (one Parameter registered twice) is replaced under all of them when tie_weights.
"""
from collections.abc import Sequence

from jitgrad.func._batched import is_batched
from jitgrad.graph.tensor import Tensor
from jitgrad.nn.module import Module
from jitgrad.ops.shape import stack

_MISSING = object()


def functional_call(module, parameter_and_buffer_dicts, args=None, kwargs=None, *, tie_weights=True, strict=False):
    if isinstance(parameter_and_buffer_dicts, dict):
        tensors = parameter_and_buffer_dicts
    elif isinstance(parameter_and_buffer_dicts, Sequence):
        if not all(isinstance(d, dict) for d in parameter_and_buffer_dicts):
            raise ValueError("Expected all elements of parameter_and_buffer_dicts to be dictionaries")
        counts = {}
        for d in parameter_and_buffer_dicts:
            for k in d:
                counts[k] = counts.get(k, 0) + 1
        repeated = [k for k, n in counts.items() if n > 1]
        if repeated:
            raise ValueError(f"{repeated} appeared in multiple dictionaries; behavior of functional call is ambiguous")
        tensors = {k: v for d in parameter_and_buffer_dicts for k, v in d.items()}
    else:
        raise ValueError("Expected parameter_and_buffer_dicts to be a dict, or a list/tuple of dicts, "
                         f"but got {type(parameter_and_buffer_dicts)}")
    if kwargs is None:
        kwargs = {}
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = (args,)
    if tie_weights:
        swapped = _untie(module, tensors)
    else:
        swapped = tensors
    if strict:
        _check_keys(module, swapped)
    originals = _swap_all(module, swapped)
    try:
        return module(*args, **kwargs)
    finally:
        # what the call left in the module (the tensors given, unless it reassigned them)
        # goes back into the caller's dict, as torch's _reparametrize_module does
        current = _swap_all(module, originals)
        tensors.update({k: current[k] for k in tensors if k in current})


def stack_module_state(models):
    """({name: parameters stacked}, {name: buffers stacked}) of models of one class and mode.
    Stacked parameters are new leaves (requires_grad as the models' were), unrelated to the
    models' own, so an optimizer can step them directly."""
    models = list(models)
    if len(models) == 0:
        raise RuntimeError("stack_module_state: Expected at least one model, got 0.")
    if not (all(m.training for m in models) or not any(m.training for m in models)):
        raise RuntimeError("stack_module_state: Expected all models to have the same training/eval mode.")
    if not all(type(m) is type(models[0]) for m in models):
        raise RuntimeError("stack_module_state: Expected all models to be of the same class.")

    def stacked(named):
        per_model = [dict(named(m)) for m in models]
        return {k: _stacked_leaf([d[k] for d in per_model], k) for k in per_model[0]}
    return stacked(lambda m: m.named_parameters()), stacked(lambda m: m.named_buffers())


def _stacked_leaf(tensors, name):
    grads = {t.requires_grad for t in tensors}
    if len(grads) > 1:
        raise RuntimeError(f"Expected {name} from each model to have the same .requires_grad")
    result = stack(tensors)
    return result.detach().requires_grad_() if grads == {True} else result


def _named_tensors(module, prefix=""):
    """Every (dotted name, tensor) of the parameters and buffers, a tensor reachable under
    several names listed under each (torch's remove_duplicate=False)."""
    for name, t in list(module._parameters.items()) + list(module._buffers.items()):
        if t is not None:
            yield prefix + name, t
    for name, sub in module._modules.items():
        if sub is not None:
            yield from _named_tensors(sub, prefix + name + ".")


def _untie(module, tensors):
    """tensors extended to every name of a tied tensor one of whose names is given."""
    names_of = {}
    for name, t in _named_tensors(module):
        names_of.setdefault(id(t), set()).add(name)
    tied = {name: names for names in names_of.values() if len(names) > 1 for name in names}
    given_tied = [name for name in tensors if name in tied]
    for name in given_tied:
        names = tied[name]
        if len(names.intersection(given_tied)) > 1 and len({id(tensors[n]) for n in names if n in tensors}) != 1:
            raise ValueError(f"functional_call got multiple values for keys {sorted(names)}, which are tied. "
                             "Consider using tie_weights=False")
    untied = dict(tensors)
    for name in given_tied:
        for other in tied[name]:
            untied[other] = tensors[name]
    return untied


def _check_keys(module, tensors):
    valid = {name for name, _ in _named_tensors(module)}
    keys = set(tensors)
    missing, unexpected = sorted(valid - keys), sorted(keys - valid)
    msgs = []
    if unexpected:
        msgs.append(f"Unexpected key(s): {', '.join(map(repr, unexpected))}.")
    if missing:
        msgs.append(f"Missing key(s): {', '.join(map(repr, missing))}.")
    if msgs:
        raise RuntimeError("Error(s) in reparametrizing for {}:\n\t{}".format(type(module).__name__, "\n\t".join(msgs)))


def _swap_all(module, tensors):
    """Swap each named tensor in; returns what was there (_MISSING where nothing was).
    A failure part way swaps the ones done back before raising."""
    done = {}
    try:
        for name, t in tensors.items():
            done[name] = _swap(module, name, t)
    except Exception:
        for name, t in done.items():
            _swap(module, name, t)
        raise
    return done


def _submodule(module, path):
    for attr in path.split(".") if path else ():
        try:
            sub = getattr(module, attr)
        except AttributeError as ex:
            raise AttributeError(f"{type(module).__name__} has no attribute `{attr}`") from ex
        if not isinstance(sub, Module):
            raise TypeError(f"submodule `{path}`: {sub} is not an instance of torch.nn.Module")
        module = sub
    return module


def _swap(module, name, tensor):
    prefix, _, attr = name.rpartition(".")
    module = _submodule(module, prefix)
    if tensor is not _MISSING and tensor is not None and not isinstance(tensor, Tensor) and not is_batched(tensor):
        raise TypeError(f"{tensor} is not an instance of torch.Tensor")
    if attr in module._parameters or attr in module._buffers:
        d = module._parameters if attr in module._parameters else module._buffers
        orig = d[attr]
        if tensor is _MISSING:
            del d[attr]
        else:
            d[attr] = tensor
        return orig
    orig = getattr(module, attr, _MISSING)
    if orig is not _MISSING and orig is not None and not isinstance(orig, Tensor) and not is_batched(orig):
        raise TypeError(f"attribute `{attr}`: {orig} is not an instance of torch.Tensor")
    if tensor is not _MISSING:
        setattr(module, attr, tensor)
    elif orig is not _MISSING:
        delattr(module, attr)
    return orig
