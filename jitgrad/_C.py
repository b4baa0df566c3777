"""The few names of torch._C that library code reaches for by name (`except torch._C._LinAlgError`)."""
from jitgrad.linalg import LinAlgError as _LinAlgError  # noqa: F401
