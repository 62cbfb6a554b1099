"""Build definition for the compiled kernel only; metadata lives in pyproject.toml.

MOESIM_DEBUG=1 turns Cython's bounds checks back on and compiles the C core with -O0 -g, for a
debug build that catches indexing errors in the glue: any index outside [0, len) raises IndexError.
Wraparound stays off as in the release build, so a negative index is refused, not silently wrapped
(the release glue would read before the buffer there).
MOESIM_SANITIZE=1 (gcc or clang, not MSVC) compiles the C core and the Cython-generated C with
AddressSanitizer + UndefinedBehaviorSanitizer (-fsanitize=address,undefined
-fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g) and links the sanitizer runtimes;
the interpreter must then preload ASan's runtime (LD_PRELOAD=$(gcc -print-file-name=libasan.so),
ASAN_OPTIONS=detect_leaks=0, since CPython itself keeps memory at exit). The two switches combine
(bounds-checked glue under the sanitizers, at -O1); tests/test_sanitized_build.py builds that way.
OpenMP is used when the compiler accepts it and is never required.
"""
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

DEBUG = os.environ.get("MOESIM_DEBUG", "") not in ("", "0")
SANITIZE = os.environ.get("MOESIM_SANITIZE", "") not in ("", "0")
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"]


def _compiler_accepts(compiler, flag: str) -> bool:
    """True when the compiler builds and links a tiny OpenMP program with *flag*."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "omp_probe.c"
        src.write_text("#include <omp.h>\nint main(void){return omp_get_max_threads() > 0 ? 0 : 1;}\n")
        try:
            objs = compiler.compile([str(src)], output_dir=tmp, extra_postargs=[flag])
            compiler.link_executable(objs, str(Path(tmp) / "omp_probe"), extra_postargs=[flag])
        except Exception:
            return False
    return True


class BuildExt(build_ext):
    """Adds OpenMP flags only when the toolchain supports them."""

    def build_extensions(self):
        use_openmp = os.environ.get("MOESIM_NO_OPENMP", "") in ("", "0")
        flag = "/openmp" if self.compiler.compiler_type == "msvc" else "-fopenmp"
        if use_openmp and _compiler_accepts(self.compiler, flag):
            for ext in self.extensions:
                ext.extra_compile_args.append(flag)
                ext.extra_link_args.append(flag)
                ext.define_macros.append(("MOESIM_HAVE_OPENMP", "1"))
        super().build_extensions()


if sys.platform == "win32":
    c_args = ["/O2"]
elif DEBUG:
    c_args = ["-O0", "-g", "-std=c99", "-Wall"]
else:
    c_args = ["-O3", "-std=c99"]
if SANITIZE and sys.platform == "win32":
    sys.exit("MOESIM_SANITIZE=1 needs gcc or clang (AddressSanitizer + UBSan flags); MSVC is not supported")
if SANITIZE:
    c_args += ["-O1", "-g", *SANITIZE_FLAGS]  # the last -O wins

extensions = [
    Extension(
        "moesim.engine._kernel",
        sources=["src/moesim/engine/_kernel.pyx"] + sorted(str(p) for p in Path("csrc").glob("*.c")),
        include_dirs=["csrc", np.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_22_API_VERSION")],
        extra_compile_args=list(c_args),
        extra_link_args=list(SANITIZE_FLAGS) if SANITIZE else [],
    )
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={
            "boundscheck": DEBUG,
            "wraparound": False,  # as in release; with boundscheck a negative index raises, never wraps
            "cdivision": not DEBUG,
            "initializedcheck": DEBUG,
        },
    ),
    cmdclass={"build_ext": BuildExt},
)
