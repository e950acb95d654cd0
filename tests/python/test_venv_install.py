# The install the README documents, offline with Debian's packages: a fresh venv that sees the
# system's site-packages, `pip install --no-build-isolation` of the repository, reusing this CMake
# build (BACKPROP_CMAKE_BUILD_DIR) so only the module's up-to-date check runs; then the installed
# package (not build/python) is imported and trains.
import os
import subprocess
import sys

from conftest import BIN, DATA, MODEL, SRC


def test_pip_install_into_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = dict(os.environ, BACKPROP_CMAKE_BUILD_DIR=str(BIN), PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-build-isolation", str(SRC)], check=True, env=env,
                   timeout=600)
    code = (
        "import backpropagate as bp, json, sys; assert 'site-packages' in bp.__file__, bp.__file__;"
        f"r = bp.Trainer({MODEL!r}, output={str(tmp_path / 'runs')!r}, steps=1, batch_size=2, max_seq_length=64,"
        f" lora_r=2, threads=1, holdout=0, device='cpu').train({DATA!r}, progress=False);"
        "print(json.dumps([bp.__version__, r.steps]))"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], check=True, env=env, capture_output=True,
                         text=True, cwd=tmp_path, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == '["0.1.0", 1]'
