"""Triton kernels, each bit-identical to the PyTorch path it accelerates."""
