"""Compiled backward: @njit kernels and the scheduler that sweeps the lowered graph."""
