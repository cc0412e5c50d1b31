"""The local Azure Storage emulator used by the tests, the demo and the benchmarks.

Not part of the installed library: see :mod:`azurite.launcher`.
"""
