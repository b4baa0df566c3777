from jitgrad.utils import checkpoint, data, dlpack  # noqa: F401
