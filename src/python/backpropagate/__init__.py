"""backpropagate: fine-tune language models from Python with backprop's C++ library.

    from backpropagate import Trainer
    trainer = Trainer("models/tiny-chat", lora_r=8, steps=50)
    result = trainer.train("examples/quickstart_sharegpt.jsonl")
    trainer.export(format="gguf", quantization="q8_0")

The same library as the ``backprop`` command (no second implementation): settings are its
settings table's, errors its catalog's (``backpropagate.errors``), Ctrl-C its checkpoint-and-stop.
Logs go to the ``logging`` logger "backpropagate" (configure it as any other: with no
configuration, Python shows its warnings and errors; ``logging.basicConfig(level=logging.INFO)``
shows the info lines ``backprop`` prints).
"""

import os as _os

# libgomp reads OMP_WAIT_POLICY once, when it loads (with the module below): passive waits, as the
# backprop command sets for itself (spinning OpenMP threads fight each other and BLAS on a busy or
# small machine; cli/main.cpp tune_runtime_environment).
_os.environ.setdefault("OMP_WAIT_POLICY", "passive")

from . import _core  # noqa: E402
from .errors import *  # noqa: E402,F401,F403
from .errors import BackpropError, OutOfMemoryError  # noqa: E402,F401
from ._records import (  # noqa: E402,F401
    DoctorReport,
    ExportResult,
    GenerateResult,
    MemoryPlan,
    RunInfo,
    TrainResult,
    ValidateReport,
)
from .trainer import Trainer, doctor, load_run, runs, validate  # noqa: E402,F401

__version__ = _core.version()
