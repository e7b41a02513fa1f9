"""The runtime distribution's native kernels: the same extension as the repository's setup.py."""

import importlib.util
from pathlib import Path

from setuptools import setup

# absolute: object files of relative '../..' sources would land outside build/ (build_ext puts
# an object at build_temp/<source path>), while an absolute source path is kept inside it
ROOT = str(Path(__file__).resolve().parents[2])


def _root_setup():
    spec = importlib.util.spec_from_file_location(
        "dayzero_setup", Path(ROOT) / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines native_extension; setup() runs only as __main__
    return module


# egg-info next to this file, not in the repository root (package-dir), where it would make
# every checkout on sys.path look like an installed dayzero-runtime
setup(ext_modules=[_root_setup().native_extension(ROOT)],
      options={"egg_info": {"egg_base": str(Path(__file__).resolve().parent)}})
