from jitgrad.utils import checkpoint  # noqa: F401
