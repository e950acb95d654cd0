# Exceptions: one class per catalog category, made from the catalog; each real failure raises the
# class and attributes of the error the CLI reports for the same input (its --json envelope).
import builtins

import pytest

import backpropagate as bp
from backpropagate import errors
from conftest import DATA, MODEL, TINY, TINY_FLAGS, cli_json


def test_a_class_per_catalog_category_and_out_of_memory():
    categories = {row["category"] for row in bp._core.error_catalog()}
    classes = {errors.error_class(row["code"]) for row in bp._core.error_catalog()}
    assert len(categories) == 5
    for c in categories:
        cls = getattr(bp, errors._class_name(c))
        assert issubclass(cls, bp.BackpropError) and cls in classes
        assert not hasattr(builtins, cls.__name__) or getattr(builtins, cls.__name__) is not cls
    assert bp.ConfigError and bp.InputError and bp.DependencyError and bp.StateError
    assert bp.BackpropRuntimeError is not RuntimeError
    assert issubclass(bp.OutOfMemoryError, bp.BackpropRuntimeError)
    for code in ("RUNTIME_OOM_RECOVERY_EXHAUSTED", "RUNTIME_CPU_OOM", "RUNTIME_GPU_OOM"):
        assert errors.error_class(code) is bp.OutOfMemoryError
    assert errors.error_class("RUNTIME_TRAINING_FAILED") is bp.BackpropRuntimeError


def envelope_matches(exc, env):
    assert exc.code == env["code"]
    assert exc.message == env["message"]
    assert exc.suggestion == env["suggestion"]
    assert exc.retryable == env["retryable"]
    assert exc.details == env["details"]


def test_a_value_out_of_range_is_the_clis_config_error(runs_dir):
    with pytest.raises(bp.ConfigError) as e:
        bp.Trainer(MODEL, output=runs_dir, lora_r=0)
    code, env = cli_json("train", "--model", MODEL, "--data", DATA, "--lora-r", "0", check=False)
    assert code == 1 and e.value.code == "CONFIG_INVALID_SETTING"
    envelope_matches(e.value, env)
    assert isinstance(e.value, bp.BackpropError) and e.value.run_id is None


def test_an_unknown_setting_is_a_config_error():
    with pytest.raises(bp.ConfigError) as e:
        bp.Trainer(MODEL, lora_rank=4)
    code, env = cli_json("train", "--model", MODEL, "--lora-rank", "4", check=False)
    assert e.value.code == env["code"] == "CONFIG_INVALID"
    assert "lora_rank" in e.value.message and "lora_r=16" in e.value.suggestion


def test_a_missing_model_is_the_clis_error(runs_dir, tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(bp.BackpropError) as e:
        bp.Trainer(missing, output=runs_dir, **TINY).train(DATA, progress=False)
    code, env = cli_json("train", "--model", missing, "--data", DATA, "--output", tmp_path / "cli", *TINY_FLAGS,
                         check=False)
    assert code != 0
    assert type(e.value) is errors.error_class(env["code"])
    envelope_matches(e.value, env)


def test_a_missing_dataset_is_an_input_error(runs_dir, tmp_path):
    with pytest.raises(bp.InputError) as e:
        bp.Trainer(MODEL, output=runs_dir, **TINY).train(str(tmp_path / "none.jsonl"), progress=False)
    assert e.value.code == "INPUT_DATASET_NOT_FOUND" and e.value.retryable == "no"


def test_injected_oom_exhaustion_is_out_of_memory_error(runs_dir, tmp_path):
    inject = dict(TINY, fault_inject_oom_step=1, fault_inject_oom_count=50)
    with pytest.raises(bp.OutOfMemoryError) as e:
        bp.Trainer(MODEL, output=runs_dir, **inject).train(DATA, progress=False)
    exc = e.value
    assert exc.code == "RUNTIME_OOM_RECOVERY_EXHAUSTED" and exc.category == "runtime"
    assert exc.suggestion and exc.retryable in ("yes", "no", "sometimes")
    (run,) = bp.runs(runs_dir)
    assert exc.run_id == run.id and run.status == "failed" and run.code == exc.code
    code, env = cli_json("train", "--model", MODEL, "--data", DATA, "--output", tmp_path / "cli", *TINY_FLAGS,
                         "--fault-inject-oom-step", "1", "--fault-inject-oom-count", "50", check=False)
    assert code == 2 and env["code"] == exc.code and env["retryable"] == exc.retryable
    try:
        bp.Trainer(MODEL, output=runs_dir, **inject).train(DATA, progress=False)
    except bp.OutOfMemoryError as caught:  # the way a user writes it
        assert caught.code == "RUNTIME_OOM_RECOVERY_EXHAUSTED"


def test_config_file_is_read_like_the_clis(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text("[lora]\nr = 6\n[training]\nlr = 0.003\n")
    t = bp.Trainer(MODEL, config=str(good), lr=0.001)
    assert t.setting("lora_r") == "6" and t.setting("training.lr") == "0.001", "keyword arguments beat the file"
    bad = tmp_path / "bad.toml"
    bad.write_text("[lora]\nr = 0\n")
    with pytest.raises(bp.ConfigError) as e:
        bp.Trainer(MODEL, config=bad)
    code, env = cli_json("--config", bad, "train", "--model", MODEL, "--data", DATA, check=False)
    assert code == 1
    envelope_matches(e.value, env)


def test_nproc_is_the_commands_not_pythons(runs_dir):
    # `backprop train --nproc N` runs itself under mpirun; a Python process cannot: refused, with the way.
    with pytest.raises(bp.ConfigError) as e:
        bp.Trainer(MODEL, output=runs_dir, nproc=2, **TINY).train(DATA, progress=False)
    assert e.value.code == "CONFIG_INVALID_SETTING"
    assert "mpirun -np 2 python3" in e.value.suggestion
