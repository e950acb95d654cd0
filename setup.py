# Builds the extension module backpropagate._core with the project's CMake (pyproject.toml says
# why); the pure-Python files come from src/python/backpropagate/.
#   BACKPROP_CMAKE_BUILD_DIR  a CMake build folder to reuse (configured with the Python package on:
#                             only its `python_package` target is built); default: a new build in
#                             build-python/ (Release, no tests, no benchmarks)
#   BACKPROP_CMAKE_ARGS       more arguments for a new configuration (-DBACKPROP_CUDA=OFF, ...)
#   BACKPROP_JOBS             build parallelism (default: all cores)
import glob
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
REUSE = os.environ.get("BACKPROP_CMAKE_BUILD_DIR", "")
BUILD = os.path.abspath(REUSE) if REUSE else os.path.join(ROOT, "build-python")


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        if not os.path.isfile(os.path.join(BUILD, "CMakeCache.txt")):
            args = [
                "-S", ROOT, "-B", BUILD, "-DCMAKE_BUILD_TYPE=Release", "-DBACKPROP_PYTHON=ON",
                "-DBACKPROP_BUILD_TESTS=OFF", "-DBACKPROP_BUILD_BENCH=OFF", f"-DPython_EXECUTABLE={sys.executable}",
            ]
            try:
                import pybind11  # noqa: PLC0415

                if os.path.isdir(pybind11.get_cmake_dir()):  # PyPI's; Debian's answers a folder it lacks
                    args.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
            except (ImportError, AttributeError):
                pass  # Debian's pybind11-dev: found by CMake in /usr/lib/cmake
            args += shlex.split(os.environ.get("BACKPROP_CMAKE_ARGS", ""))
            subprocess.check_call(["cmake", *args])
        jobs = os.environ.get("BACKPROP_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", BUILD, "--target", "python_package", "-j", jobs])
        built = glob.glob(os.path.join(BUILD, "python", "backpropagate", "_core*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected one _core*.so in {BUILD}/python/backpropagate, found {built}")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(built[0], dest)


setup(
    packages=["backpropagate"],
    package_dir={"backpropagate": "src/python/backpropagate"},
    package_data={"backpropagate": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("backpropagate._core", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # setuptools' own build folder, away from CMake's build/
    options={"build": {"build_base": os.path.join(BUILD, "setuptools")}},
)
