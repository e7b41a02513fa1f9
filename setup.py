"""Builds dayzero's native ONNX Runtime kernels (backends/onnxruntime/native) with the package.

Everything else is declared in pyproject.toml. The library is optional: where no C++17 compiler
is available the build goes on without it, and the onnxruntime backend lowers to ONNX Runtime's
own kernels instead (see backends/onnxruntime/native_ops.py).
"""

from setuptools import Extension, setup

NATIVE = "backends/onnxruntime/native"

setup(
    ext_modules=[
        Extension(
            "backends.onnxruntime._dayzero_ort_ops",
            sources=[f"{NATIVE}/custom_ops.cc", f"{NATIVE}/causal_attention.cc"],
            depends=[f"{NATIVE}/causal_attention.h", f"{NATIVE}/ort_abi.h"],
            language="c++",
            extra_compile_args=["-std=c++17", "-O3", "-fvisibility=hidden"],
            optional=True,
        )
    ]
)
