from jitgrad.utils import benchmark, checkpoint, data, dlpack  # noqa: F401
