# examples/python: the quick start script runs end to end, and so do the notebook's code cells, in
# order, as one script (Debian's nbconvert would pull in Jupyter: the cells are the notebook).
import json
import os
import subprocess
import sys

import backpropagate
from conftest import SRC

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(backpropagate.__file__)))


def run(code_or_path, tmp_path, *, is_path):
    env = dict(os.environ, QUICKSTART_STEPS="2", QUICKSTART_OUTPUT=str(tmp_path / "runs"), QUICKSTART_ROOT=str(SRC),
               PYTHONPATH=PACKAGE_PARENT)
    args = [sys.executable, str(code_or_path)] if is_path else [sys.executable, "-c", code_or_path]
    p = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_quickstart_script(tmp_path):
    out = run(SRC / "examples" / "python" / "quickstart.py", tmp_path, is_path=True)
    assert "fits: True" in out and "exported:" in out and ".gguf" in out


def test_quickstart_notebook_cells(tmp_path):
    nb = json.loads((SRC / "examples" / "python" / "quickstart.ipynb").read_text(encoding="utf-8"))
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert len(cells) >= 4
    # A cell's last expression is shown by Jupyter: print it here.
    code = "\n".join(cells[:-1]) + "\n" + "\n".join(cells[-1].splitlines()[:-1]) + "\nprint(" + cells[-1].splitlines()[-1] + ")\n"
    out = run(code, tmp_path, is_path=False)
    assert "fits: True" in out and ".gguf" in out
