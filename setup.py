"""Builds dayzero's native ONNX Runtime kernels (backends/onnxruntime/native) with the package.

Everything else is declared in pyproject.toml. The library is optional: where no C++17 compiler
is available the build goes on without it, and the onnxruntime backend lowers to ONNX Runtime's
own kernels instead (see backends/onnxruntime/native_ops.py). packaging/runtime/setup.py builds
the same library into the runtime-only distribution through `native_extension`.
"""

import os

from setuptools import Extension, setup

NATIVE = "backends/onnxruntime/native"


def native_extension(root: str = ".") -> Extension:
    """The custom-op library; `root` is the repository root, relative to the running setup
    script or absolute (packaging/runtime's, so that its object files stay in its build/)."""
    native = os.path.normpath(os.path.join(root, NATIVE))
    return Extension(
        "backends.onnxruntime._dayzero_ort_ops",
        sources=[f"{native}/custom_ops.cc", f"{native}/causal_attention.cc",
                 f"{native}/paged_op.cc", f"{native}/paged_attention.cc",
                 f"{native}/int4_op.cc", f"{native}/int4_matmul.cc",
                 f"{native}/packed_linear_op.cc", f"{native}/packed_linear.cc"],
        depends=[f"{native}/causal_attention.h", f"{native}/paged_attention.h",
                 f"{native}/int4_matmul.h", f"{native}/packed_linear.h",
                 f"{native}/ort_abi.h", f"{native}/op_support.h"],
        language="c++",
        extra_compile_args=["-std=c++17", "-O3", "-fvisibility=hidden"],
        optional=True,
    )


if __name__ == "__main__":  # setuptools runs this file as __main__; packaging/runtime imports it
    setup(ext_modules=[native_extension()])
