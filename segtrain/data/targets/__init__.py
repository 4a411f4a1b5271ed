"""Masks and training targets: polygon rasterisation and every target builder (NumPy, compiled numba
kernels and the torch twin for the device), plus the panoptic ground truth evaluation compares with.

The NumPy twins of the compiled kernels (``rasterise._rasterise_numpy``, ``builders._targets_numpy``) are a
supported fallback, not only a test oracle: numba is a dependency, but a build that does not match the
installed NumPy must cost speed, never results (``compiled.py`` warns once and the twin runs). The tests
hold the twins to the kernels bit for bit, so each is the other's oracle.
"""
