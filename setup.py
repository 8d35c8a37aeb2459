"""Only the compiled part of the build; everything else is in pyproject.toml.

`pip install -e .` (and `make test`) compiles the log engine's hot loops (the cleaner's, a produced set's
check and append, a batch's record columns: one module per job, sharing sidecar/log/_record_format.h), the
codec's schema interpreter, the native Produce path and the node's I/O thread with the machine's C compiler.
All are optional at run time: without them the cleaner runs its pure-Python loops
(sidecar/log/cleaner_kernel.py), `Log.append` and the record decoders their Python, the codec its generated Python
(sidecar/protocol/generated_codec.py) and every request the Python path, but the test suite requires them
to be built.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "shale.sidecar.log._cleaner_kernel",
            sources=["sidecar/log/_cleaner_kernel.c"],
            depends=["sidecar/log/_record_format.h"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        ),
        Extension(
            "shale.sidecar.log._append_kernel",
            sources=["sidecar/log/_append_kernel.c"],
            depends=["sidecar/log/_record_format.h"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        ),
        Extension(
            "shale.sidecar.log._columns_kernel",
            sources=["sidecar/log/_columns_kernel.c"],
            depends=["sidecar/log/_record_format.h"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        ),
        Extension(
            "shale.sidecar.server.network._native_produce",
            sources=["sidecar/server/network/_native_produce.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        ),
        Extension(
            "shale.sidecar.server.network._io_thread",
            sources=["sidecar/server/network/_io_thread.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        ),
        Extension(
            "shale.sidecar.protocol._codec_kernel",
            sources=["sidecar/protocol/_codec_kernel.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        ),
    ],
)
