# The package around the trainer: help and the type stub from the settings table, estimate_vram and
# export equal to the CLI's for the same inputs, the run history and doctor.
import io
import json
import os
import pathlib
import pydoc

import pytest

import backpropagate as bp
from backpropagate import _stubgen
from conftest import DATA, MODEL, SRC, TINY, cli, cli_json, file_bytes


def test_help_lists_every_training_setting_with_its_help():
    text = pydoc.render_doc(bp.Trainer, renderer=pydoc.plaintext)
    listed = [row for row in bp._core.settings_table() if row["train"] and not row["testing"]]
    assert len(listed) > 40
    for row in listed:
        assert row["name"] in text, row["key"]
        assert row["help"][:60] in " ".join(text.split()), row["key"]


def test_the_checked_in_stub_is_the_generators_output():
    stub = (SRC / "src" / "python" / "backpropagate" / "__init__.pyi").read_text(encoding="utf-8")
    assert stub == _stubgen.stub(), "regenerate: python3 -m backpropagate._stubgen > src/python/backpropagate/__init__.pyi"
    assert "    lora_r: Optional[int] = None,  # lora.r\n" in stub


SHAPE = dict(lora_r=4, max_seq_length=64, batch_size=2, device="cpu")
SHAPE_FLAGS = ["--lora-r", "4", "--max-seq-length", "64", "--batch-size", "2", "--device", "cpu"]


@pytest.mark.parametrize("gib", [8, 0.001])
def test_estimate_vram_is_the_clis_plan(gib):
    plan = bp.Trainer(MODEL, **SHAPE).estimate_vram(memory=gib)
    _, expected = cli_json("estimate-vram", "--model", MODEL, *SHAPE_FLAGS, "--vram-gb", gib)
    assert plan.data == expected
    assert plan.fits is (gib == 8) and plan.fits == expected["fits"]
    assert plan.rows[-1] == ("total", expected["plan"]["total"])
    assert sum(b for name, b in plan.rows[:-1]) >= plan.total_bytes


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    runs = tmp_path_factory.mktemp("export") / "runs"
    t = bp.Trainer(MODEL, output=str(runs), **TINY)
    return t, t.train(DATA, progress=False)


@pytest.mark.parametrize("fmt,quant", [("lora", None), ("gguf", "q8_0")])
def test_export_equals_the_clis(trained, tmp_path, fmt, quant):
    t, run = trained
    ours = tmp_path / "py" / ("out.gguf" if fmt == "gguf" else "out")
    theirs = tmp_path / "cli" / ("out.gguf" if fmt == "gguf" else "out")
    res = t.export(format=fmt, quantization=quant, output=str(ours))
    flags = ["--quantization", quant] if quant else []
    _, expected = cli_json("export", run.output_dir, "--format", fmt, *flags, "--output", theirs)
    assert res.format == expected["format"] == fmt
    assert set(expected) <= set(res.data)
    if fmt == "gguf":
        assert ours.read_bytes() == theirs.read_bytes()
    else:
        assert file_bytes(ours) == file_bytes(theirs)


def test_export_refuses_what_the_cli_refuses(trained):
    t, run = trained
    with pytest.raises(bp.ConfigError) as e:
        t.export(format="lora", quantization="q8_0")
    _, env = cli_json("export", run.output_dir, "--format", "lora", "--quantization", "q8_0", check=False)
    assert e.value.code == env["code"] == "CONFIG_INVALID_SETTING" and e.value.message == env["message"]
    with pytest.raises(bp.ConfigError):
        t.export(format="onnx")


def test_export_push_to_hub_reaches_the_push(trained, monkeypatch):
    # push_to_hub= is not ignored: the push's own checks run (a bad name, then no token), with the
    # CLI's codes, before anything is exported or sent (the upload itself: tests/hub/push_cli_test.cpp).
    t, run = trained
    with pytest.raises(bp.InputError) as e:
        t.export(format="lora", push_to_hub="not-a-repo")
    assert e.value.code == "INPUT_VALIDATION_FAILED" and "not-a-repo" in e.value.message
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", os.path.join(run.output_dir, "no-token-file"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(bp.DependencyError) as e:
        t.export(format="lora", push_to_hub="alice/tiny", private=True)
    assert e.value.code == "DEP_HUB_AUTH_FAILED"
    _, env = cli_json("push", run.output_dir, "--repo", "alice/tiny", check=False)
    assert env["code"] == "DEP_HUB_AUTH_FAILED" and env["message"] == e.value.message


def test_runs_and_load_run(trained):
    t, run = trained
    root = os.path.dirname(run.output_dir)
    listed = bp.runs(root)
    assert [r.id for r in listed] == [run.run_id]
    _, expected = cli_json("runs", "--output", root)
    assert [r.data for r in listed] == expected
    one = bp.load_run(run.run_id, folder=root)
    assert one.status == "finished" and one.steps == 2 and one.settings["lora"]["r"] == 4
    assert bp.load_run(run.output_dir).id == run.run_id
    with pytest.raises(bp.InputError):
        bp.load_run("no-such-run", folder=root)


def test_doctor_text_and_file_are_the_clis(tmp_path):
    text = "[ERROR] [RUNTIME_OOM_RECOVERY_EXHAUSTED] out of memory at step 3\n"
    path = tmp_path / "log.txt"
    path.write_text(text)
    _, expected = cli_json("doctor", path)
    assert bp.doctor(text).data == expected
    assert bp.doctor(str(path)).data == expected
    assert bp.doctor(path).recognised
    with pytest.raises(bp.InputError):
        bp.doctor("   \n  ")


def test_validate_is_the_clis_report(tmp_path):
    report = bp.validate(DATA, max_errors=5)
    _, expected = cli_json("validate", DATA, "--max-errors", "5", check=False)
    assert {k: v for k, v in report.data.items() if k != "text"} == expected
    assert report.valid and report.bad_rows == 0
    rows = [{"nonsense": 1}] + [json.loads(line) for line in open(DATA, encoding="utf-8")][:3]
    bad = bp.validate(rows)
    assert not bad.valid and bad.bad_rows == 1 and bad.issues[0]["line"] == 1
    assert "1 bad" in bad.text


def test_generate_is_the_clis(trained):
    t, run = trained
    ours = t.generate("Tim has a red ball. What does Tim have?", max_new_tokens=8, seed=3)
    _, expected = cli_json("generate", "--model", t.setting("model"), "--adapter", run.adapter_path, "--prompt",
                           "Tim has a red ball. What does Tim have?", "--max-new-tokens", "8", "--seed", "3")
    for key in ("output_ids", "completion", "text", "prompt_ids", "stop_reason", "adapter", "seed"):
        assert ours.data[key] == expected[key], key
    base = t.generate("Tim has a red ball. What does Tim have?", adapter=False, max_new_tokens=8, seed=3)
    assert base.adapter == ""
