from jitgrad.utils import checkpoint, dlpack  # noqa: F401
