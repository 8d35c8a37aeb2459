"""Only the compiled part of the build; everything else is in pyproject.toml.

`pip install -e .` (and `make test`) compiles the cleaner's hot loops with the machine's C
compiler. The module is optional at run time: without it the cleaner runs its pure-Python
loops (sidecar/log/cleaner_kernel.py), but the test suite requires it to be built.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "shale.sidecar.log._cleaner_kernel",
            sources=["sidecar/log/_cleaner_kernel.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ],
)
