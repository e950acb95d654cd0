"""The Trainer: backprop's training, export and memory estimate from Python.

Settings are the settings table's (src/core/settings_registry.inc), named by their command-line
flag with ``_`` for ``-``: ``Trainer("models/tiny-chat", lora_r=16, lr=2e-4, steps=200)`` is
``backprop train --model models/tiny-chat --lora-r 16 --lr 2e-4 --steps 200``; ``config=`` reads a
TOML file as ``--config`` does, and ``BACKPROPAGATE_*`` environment variables apply too. An
unknown name or a bad value raises the CLI's error (``ConfigError``: CONFIG_INVALID,
CONFIG_INVALID_SETTING).
"""

import collections.abc
import inspect
import json
import os

from . import _core
from ._progress import Progress
from ._records import ExportResult, GenerateResult, MemoryPlan, RunInfo, TrainResult, ValidateReport
from .errors import BackpropError, error_class

__all__ = ["Trainer", "runs", "load_run", "doctor", "validate"]

SETTINGS = [row for row in _core.settings_table()]


def _input_error(message):
    code = "INPUT_VALIDATION_FAILED"
    from .errors import CATALOG  # noqa: PLC0415

    return error_class(code)(code, message, suggestion=CATALOG[code]["suggestion"], category="input")


def _jsonable(value):
    for attr in ("item", "tolist"):  # numpy scalars and arrays, torch tensors
        if hasattr(value, attr):
            return getattr(value, attr)()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _data_file(data, run_dir, name):
    """A dataset argument as a file path: a path as given; rows (a list, a generator, a
    datasets.Dataset: any iterable of dicts) written as JSONL into the run folder, where a resumed
    run finds them again."""
    if isinstance(data, (str, os.PathLike)):
        return os.fspath(data)
    if isinstance(data, collections.abc.Mapping) or not isinstance(data, collections.abc.Iterable):
        raise _input_error(
            f"[python] data must be a path or an iterable of dicts (rows), not a {type(data).__name__}"
        )
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, name)
    with open(path, "w", encoding="utf-8") as f:
        for i, row in enumerate(data):
            if not isinstance(row, collections.abc.Mapping):
                raise _input_error(
                    f"[python] data row {i} is a {type(row).__name__}, not a dict "
                    "(a pandas DataFrame: pass df.to_dict('records'))"
                )
            f.write(json.dumps(dict(row), ensure_ascii=False, default=_jsonable) + "\n")
    return path


def _checkpoint_step(name):
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


class Trainer:
    def __init__(self, model=None, *, config=None, **settings):
        if model is not None:
            settings["model"] = os.fspath(model) if isinstance(model, os.PathLike) else model
        self._config = os.fspath(config) if config else ""
        self._settings = _core.load_settings(self._config, settings, "train")
        self.last_result = None

    # -- settings --------------------------------------------------------------------------------
    def setting(self, key):
        """A setting's value in text form, by its key (``"training.lr"``) or Python name (``"lr"``)."""
        for row in SETTINGS:
            if key == row["key"] or (row["train"] and key == row["name"]):
                return self._settings.text(row["key"])
        raise KeyError(key)

    @property
    def settings(self):
        """Every setting with its value (secrets masked), by section: ``{"training": {"lr": ...}}``."""
        return json.loads(self._settings.to_json())

    def _with(self, command="train", **kwargs):
        return _core.load_settings("", kwargs, command, self._settings)

    # -- train -----------------------------------------------------------------------------------
    def train(self, data=None, eval_data=None, callback=None, resume=None, progress=True):
        """Train; returns a :class:`TrainResult`.

        ``data``: a dataset file (JSONL, JSON or TXT in any format ``backprop train`` reads), or
        rows: a list of dicts or any iterable of them (a generator, a ``datasets.Dataset``,
        ``df.to_dict("records")``); rows are written to the run folder (``train_data.jsonl``) so
        the run can be resumed. ``eval_data`` the same for a held-out set (``--eval-data``).

        ``callback(record)`` gets every record ``metrics.jsonl`` gets, as a dict, when it is
        written: ``type`` "step" after every optimizer step (step, loss, grad_norm, lr, tokens,
        bytes_in_use, bytes_peak, ...), and "eval", "event", "checkpoint", "oom_recovery", ...
        Returning ``False`` stops the run as Ctrl-C does: a checkpoint is saved, and the result
        has ``stopped=True``. An exception raised by the callback stops the run the same way and
        is raised again.

        Ctrl-C (``KeyboardInterrupt``, the notebook's stop button) finishes the step, saves a
        checkpoint and raises ``KeyboardInterrupt`` naming the run id; ``resume=`` (a run id, a
        run folder, a checkpoint folder or ``"latest"``) continues it with its own settings and
        data. ``progress``: True draws a progress bar (tqdm when installed: a widget in Jupyter; plain
        lines on stderr otherwise), "plain" the plain lines, False nothing.
        """
        extra = {}
        if resume is not None:
            extra["resume"] = os.fspath(resume) if isinstance(resume, os.PathLike) else str(resume)
            if isinstance(data, (str, os.PathLike)):
                extra["data"] = os.fspath(data)
            if isinstance(eval_data, (str, os.PathLike)):
                extra["eval_data"] = os.fspath(eval_data)
        else:
            run_id = _core.begin_new_run()
            run_dir = os.path.join(self._settings.text("training.output"), run_id)
            if data is not None:
                extra["data"] = _data_file(data, run_dir, "train_data.jsonl")
            if eval_data is not None:
                extra["eval_data"] = _data_file(eval_data, run_dir, "eval_data.jsonl")
        settings = self._with(**extra)
        bar = Progress(progress)

        def on_record(text, total_steps):
            record = json.loads(text)
            bar.update(record, total_steps)
            if callback is not None:
                return callback(record)
            return None

        try:
            out = json.loads(_core.train(settings, on_record))
        except BackpropError as e:
            # A run refused before its folder existed (a missing model) has no run to name.
            if e.run_id and not os.path.isdir(os.path.join(settings.text("training.output"), e.run_id)):
                e.run_id = None
            raise
        finally:
            bar.close()
        if out.get("stopped"):
            run = load_run(out["run_id"], folder=settings.text("training.output"))
            checkpoints = sorted(run.data.get("checkpoints") or [], key=_checkpoint_step)
            out = {
                "stopped": True,
                "message": out["message"],
                "run_id": run.id,
                "output_dir": run.path,
                "steps": run.steps,
                "final_loss": run.final_loss,
                "final_eval_loss": None,
                "final_artifact": "",
                "checkpoint": os.path.join(run.path, "checkpoints", checkpoints[-1]) if checkpoints else None,
                "run": run.data,
            }
        self.last_result = TrainResult(out)
        return self.last_result

    # -- export, estimate --------------------------------------------------------------------------
    def export(self, format="lora", quantization=None, output=None, ollama=False, input=None, **settings):
        """Export a run as ``backprop export`` does: ``format`` lora | merged | gguf | gguf-lora,
        ``quantization`` (GGUF: f16, q8_0, q4_k_m, ...), ``output`` (a folder or file; default: in
        the run folder), ``ollama=True`` registers the GGUF with Ollama (``ollama_name``,
        ``ollama_host``, ``ollama_retries``), ``push_to_hub="org/name"`` then commits the export
        with a generated model card to the Hugging Face hub as ``backprop push`` does (``private``,
        ``revision``, ``commit_message``, ``push_retries``; the token from HF_TOKEN or the login
        file; the push's result under ``data["push"]``). ``input``: a run folder, run id, checkpoint,
        adapter or model folder; default: this trainer's last run. Returns an :class:`ExportResult`."""
        if input is None:
            if self.last_result is None:
                raise _input_error("[python] export: no run to export: train first, or pass input=RUN")
            input = self.last_result.output_dir
        kwargs = dict(settings, format=format, quantization=quantization, output=output, ollama=ollama)
        st = self._with("export", **kwargs)
        return ExportResult(json.loads(_core.export_run(st, os.fspath(input))))

    def generate(self, prompt, adapter=None, system="", max_new_tokens=64, temperature=0.8, top_p=0.95, top_k=40,
                 seed=None, chat=None):
        """``backprop generate``: sample from the model with ``adapter`` (default: the adapter of
        this trainer's last run, if it made one; ``False``: the base model alone). ``chat``: auto
        (the chat template when there is one), on or off; ``seed``: same seed, same text. Returns a
        :class:`GenerateResult` (``completion``, ``text``, ``output_ids``, ``stop_reason``, ...)."""
        if adapter is None and self.last_result is not None and not self.last_result.stopped:
            artifact = self.last_result.data.get("final_artifact") or ""
            adapter = artifact if os.path.basename(artifact.rstrip("/")) == "adapter" else None
        a = _core.GenerateArgs()
        a.model_dir = self._settings.text("model.path")
        a.adapter_dir = os.fspath(adapter) if adapter else ""
        a.prompt = prompt
        a.system = system
        a.max_new_tokens = max_new_tokens
        a.temperature = temperature
        a.top_p = top_p
        a.top_k = top_k
        a.seed = "" if seed is None else str(seed)
        st = self._with("generate", chat=chat)
        return GenerateResult(json.loads(_core.generate(st, a)))

    def estimate_vram(self, memory=None):
        """The memory plan ``backprop estimate-vram --json`` prints for this trainer's model and
        settings, as a :class:`MemoryPlan` (``.fits``, ``.rows``). ``memory``: the memory to fit,
        a number of GiB (``--vram-gb``) or a size text such as ``"24G"`` (``max_memory``);
        default: the GPU's free memory, else this machine's RAM."""
        extra = {}
        if isinstance(memory, str):
            extra["max_memory"] = memory
        elif memory is not None:
            extra["vram_gb"] = memory
        return MemoryPlan(json.loads(_core.estimate_vram(self._with("estimate", **extra))))


def validate(data, model=None, format="auto", max_errors=50, max_length=2048, chat_template="", show=0,
             method=None):
    """``backprop validate``: checks a dataset (a path, or rows as ``train`` takes them) and lists
    every bad row with its line; with ``model`` lengths are exact token counts and ``show`` renders
    the first samples as training sees them; ``method`` checks the rows' shape for that training
    method. Returns a :class:`ValidateReport` (``valid``, ``bad_rows``, ``issues``, ``text``...)."""
    import tempfile  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="backpropagate-validate-") as tmp:
        o = _core.ValidateOptions()
        o.file = _data_file(data, tmp, "data.jsonl")
        o.format = format
        o.max_errors = max_errors
        o.max_length = max_length
        o.model_dir = "" if model is None else os.fspath(model)
        o.chat_template = chat_template
        o.show = show
        st = _core.load_settings("", {"method": method}, "train")
        return ValidateReport(json.loads(_core.validate(st, o)))


def runs(folder="runs"):
    """Every run under ``folder`` (``backprop runs --json``), newest first, as :class:`RunInfo`."""
    return [RunInfo(r) for r in json.loads(_core.runs(os.fspath(folder)))]


def load_run(run_id_or_path, folder="runs"):
    """One run (``backprop show-run --json``): a run folder, or a run id (or a unique prefix)
    under ``folder``."""
    return RunInfo(json.loads(_core.load_run(os.fspath(folder), os.fspath(run_id_or_path))))


def doctor(text_or_path):
    """``backprop doctor``: explains an error message or log (the text, or a file's path)."""
    if isinstance(text_or_path, os.PathLike) or (
        "\n" not in text_or_path and len(text_or_path) < 4096 and os.path.isfile(text_or_path)
    ):
        return DoctorReport(json.loads(_core.doctor_file(os.fspath(text_or_path))))
    return DoctorReport(json.loads(_core.doctor_text(text_or_path)))


from ._records import DoctorReport  # noqa: E402


def _settings_doc():
    lines = ["", "Settings (keyword arguments; the command line's flags with '_' for '-'):", ""]
    for row in SETTINGS:
        if not row["train"] or row["testing"]:
            continue
        lines.append(f"  {row['name']} ({row['type'].lower()}, default {row['default']!r}; {row['allowed']})")
        lines.append(f"      {row['help']}")
    return "\n".join(lines)


def _signature():
    params = [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
        inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None),
    ]
    for row in SETTINGS:
        if row["train"] and not row["testing"] and row["name"] != "model":  # testing: accepted, not shown
            params.append(inspect.Parameter(row["name"], inspect.Parameter.KEYWORD_ONLY, default=None))
    return inspect.Signature(params)


Trainer.__doc__ = (
    """Fine-tunes a model with backprop's trainer (the same library as ``backprop train``).

    ``Trainer(model, **settings)``: ``model`` is anything ``--model`` takes (a folder, an
    ``org/name`` hub name, a ``.gguf`` file, ``ollama:NAME``); ``config="settings.toml"`` reads a
    TOML file like ``--config``. Then ``train(data)``, ``export(...)``, ``estimate_vram()``.
"""
    + _settings_doc()
)
Trainer.__init__.__signature__ = _signature()
