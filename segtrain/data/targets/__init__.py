"""Masks and training targets: polygon rasterisation and every target builder (NumPy, compiled numba
kernels and the torch twin for the device), plus the panoptic ground truth evaluation compares with."""
