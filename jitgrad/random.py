"""torch.random: the default generator's seed and state, and fork_rng."""
import contextlib

from jitgrad.graph import tensor as _t
from jitgrad.graph.random import default_generator  # noqa: F401  (torch.random.default_generator)
from jitgrad.ops.sampling import get_rng_state, initial_seed, manual_seed, seed, set_rng_state  # noqa: F401


@contextlib.contextmanager
def fork_rng(devices=None, enabled=True, _caller="fork_rng", _devices_kw="devices", device_type=None):
    """Draws inside the block leave the generators as they were before it: the CPU's and the
    CUDA tensors' stream (jitgrad has one CUDA stream, so `devices` picks nothing more)."""
    if not enabled:
        yield
        return
    state = _t.rng_state()  # (a compiled step's replay saves and restores them at the same points)
    try:
        yield
    finally:
        _t.set_rng_state(state)
