"""torch.backends.cudnn: jitgrad's CUDA kernels are its own (gpu/kernels/), not cuDNN's, so
the flags are kept for code that sets them and select nothing."""
enabled = True
benchmark = False
deterministic = False
allow_tf32 = True


def is_available():
    return False


def version():
    return None
