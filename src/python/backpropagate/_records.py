"""Result objects: JSON the library returns, as attributes (and as the dict itself, ``.data``)."""

import json


class Record:
    """A JSON object of the library with its fields as attributes; ``data`` is the dict."""

    _aliases = {}

    def __init__(self, data):
        self.data = dict(data)

    def __getattr__(self, name):
        data = self.__dict__.get("data", {})
        if name in data:
            return data[name]
        alias = type(self)._aliases.get(name)
        if alias is not None and alias in data:
            return data[alias]
        raise AttributeError(f"{type(self).__name__} has no field {name!r} (fields: {', '.join(sorted(data))})")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.data) | set(type(self)._aliases))

    def __eq__(self, other):
        return isinstance(other, Record) and self.data == other.data

    def __repr__(self):
        return f"{type(self).__name__}({json.dumps(self.data, indent=1, default=str)[:2000]})"


class TrainResult(Record):
    """What a training run ended with: summary.json's fields (``run_id``, ``output_dir``,
    ``final_loss``, ``steps``, ``tokens``, ``seconds``, ``peak_memory_bytes``, ...), plus
    ``eval_loss`` (the final evaluation's loss, ``final_eval_loss``) and ``adapter_path`` (the
    adapter/ or model/ folder, ``final_artifact``). A run stopped by its callback has
    ``stopped=True``, the ``checkpoint`` it saved and the run's record from ``load_run``."""

    _aliases = {"eval_loss": "final_eval_loss", "adapter_path": "final_artifact"}

    @property
    def stopped(self):
        return bool(self.data.get("stopped", False))


class MemoryPlan(Record):
    """The memory plan of ``backprop estimate-vram --json``: ``fits``, ``rows`` (each part of the
    plan: name and bytes, the total last), ``plan``, ``limit_bytes``, ``headroom_bytes``,
    ``max_fit``, ``fix``, ``notes``, ``settings``, ``model``."""

    _PARTS = (
        "weights",
        "trainable",
        "gradients",
        "optimizer_state",
        "gemm_workspace",
        "saved_activations",
        "recompute_buffers",
        "cross_entropy_chunk",
        "workspace",
        "total",
    )

    @property
    def rows(self):
        plan = self.data["plan"]
        return [(name, plan[name]) for name in self._PARTS if name in plan]

    @property
    def total_bytes(self):
        return self.data["plan"]["total"]


class ExportResult(Record):
    """What ``backprop export --json`` prints, plus ``written`` (paths), ``messages``, ``warnings``
    and ``next`` (commands to try next)."""


class RunInfo(Record):
    """One run of the run history (``backprop runs --json`` / ``show-run --json``): ``id``,
    ``path``, ``status``, ``code``, ``model``, ``data``, ``steps``, ``final_loss``,
    ``best_eval_loss``, ``checkpoints``, ``settings`` (``load_run`` only)."""

    _aliases = {"run_id": "id", "output_dir": "path"}


class DoctorReport(Record):
    """``backprop doctor --json``: ``recognised``, ``matches`` (each with ``code``, ``title``,
    ``causes``, ``fixes``, ...), ``generic_first_steps``, ``truncated``."""


class GenerateResult(Record):
    """``backprop generate --json``: ``completion`` (the answer), ``text`` (prompt and answer),
    ``prompt_ids``, ``output_ids``, ``stop_reason``, ``new_tokens``, ``tokens_per_s``, ``seed``, ..."""


class ValidateReport(Record):
    """``backprop validate --json``: ``valid``, ``format``, ``total_rows``, ``good_rows``,
    ``bad_rows``, ``issues`` (line, reason, message), ``long``, ``error_code``, ``samples``; and
    ``text``, what the command prints without --json."""
