"""The native CPU kernels, compiled when the package is installed (`pip install .`, `pip install -e .`, a wheel).

They are plain C libraries, loaded with ctypes (common/native.py), built as extension modules so that setuptools
compiles them with the platform's compiler and the wheel carries them; none defines a Python module. The flags are
portable (no -march=native): a wheel built on one x86-64 machine runs on every other. Linux only (glibc's libmvec);
elsewhere, or if the build fails, the package installs without them and the torch paths run.
"""

import platform

from setuptools import Extension, setup

KERNELS = []
if platform.system() == "Linux":
    KERNELS = [
        # -ffast-math at compile time only: linked with it, gcc adds crtfastmath.o, whose constructor turns on
        # flush-to-zero for the whole process that loads the library
        Extension("output_builder.codecs._kernels", ["output_builder/codecs/kernels.c"],
                  extra_compile_args=["-O3", "-ffast-math", "-fopenmp-simd"], libraries=["mvec", "m"],
                  optional=True),
        Extension("talker._sampler_kernel", ["talker/sampler_kernel.c"],
                  extra_compile_args=["-O3"], libraries=["m"], optional=True),  # exact float math
    ]

setup(ext_modules=KERNELS)
