# Trainer.train: from a path, a list and a generator (the same adapter as `backprop train` on the same
# data and settings), the callback's records against metrics.jsonl, stopping from the callback and
# resuming to the same bytes, KeyboardInterrupt, and the GIL released while the C++ code works.
import json
import os
import signal
import sys
import threading
import _thread

import pytest

import backpropagate as bp
from conftest import DATA, MODEL, TINY, TINY_FLAGS, cli, file_bytes, metrics, rows


def adapter(result):
    return file_bytes(result.adapter_path)


def test_train_from_path_equals_the_cli_run(runs_dir, tmp_path):
    r = bp.Trainer(MODEL, output=runs_dir, **TINY).train(DATA, progress=False)
    assert isinstance(r, bp.TrainResult)
    assert r.steps == 2 and r.final_loss > 0
    assert r.output_dir == os.path.join(runs_dir, r.run_id)
    assert os.path.isfile(os.path.join(r.adapter_path, "adapter_model.safetensors"))
    with open(os.path.join(r.output_dir, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    assert summary["run_id"] == r.run_id and summary["final_loss"] == r.final_loss
    cli_dir = tmp_path / "cli"
    cli("train", "--model", MODEL, "--data", DATA, "--output", cli_dir, *TINY_FLAGS)
    (cli_run,) = os.listdir(cli_dir)
    assert file_bytes(cli_dir / cli_run / "adapter") == adapter(r), "the CLI's run on the same settings"


def test_train_from_list_and_generator_equal_the_file(runs_dir):
    data = rows(8)
    t = bp.Trainer(MODEL, output=runs_dir, **TINY)
    from_list = t.train(data, progress=False)
    from_gen = t.train((row for row in data), progress=False)
    assert from_list.run_id != from_gen.run_id, "each train() is a new run"
    with open(os.path.join(from_list.output_dir, "train_data.jsonl"), encoding="utf-8") as f:
        assert [json.loads(line) for line in f] == data, "the rows are kept in the run folder"
    path = os.path.join(runs_dir, "eight.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in data)
    from_file = t.train(path, progress=False)
    assert adapter(from_list) == adapter(from_file) == adapter(from_gen)


def test_rows_that_are_not_dicts_are_an_input_error(runs_dir):
    with pytest.raises(bp.InputError) as e:
        bp.Trainer(MODEL, output=runs_dir, **TINY).train([["not", "a", "dict"]], progress=False)
    assert e.value.code == "INPUT_VALIDATION_FAILED" and "row 0" in e.value.message


def test_callback_gets_every_record_of_metrics_jsonl(runs_dir):
    got = []
    r = bp.Trainer(MODEL, output=runs_dir, **TINY).train(DATA, callback=got.append, progress=False)
    assert got == metrics(r.output_dir)
    steps = [g for g in got if g["type"] == "step"]
    assert [s["step"] for s in steps] == [1, 2]
    assert {"loss", "lr", "tokens", "bytes_in_use", "bytes_peak", "run_id"} <= set(steps[0])


def test_callback_false_stops_with_a_checkpoint_and_resume_ends_with_the_same_adapter(runs_dir):
    settings = dict(TINY, steps=4)
    data = rows(16)
    whole = bp.Trainer(MODEL, output=runs_dir, **settings).train(data, progress=False)

    t = bp.Trainer(MODEL, output=runs_dir, **settings)
    stopped = t.train(data, callback=lambda rec: rec["type"] != "step" or rec["step"] < 2, progress=False)
    assert stopped.stopped and stopped.steps == 2
    assert os.path.isdir(stopped.checkpoint) and stopped.checkpoint.endswith("checkpoint-2")
    assert not os.path.exists(os.path.join(stopped.output_dir, "adapter"))
    assert bp.load_run(stopped.run_id, folder=runs_dir).status == "interrupted"

    resumed = t.train(resume=stopped.run_id, progress=False)
    assert resumed.run_id == stopped.run_id and resumed.steps == 4
    assert adapter(resumed) == adapter(whole)


def test_an_exception_in_the_callback_stops_the_run_and_is_raised(runs_dir):
    def boom(rec):
        if rec["type"] == "step":
            raise ValueError("from the callback")

    with pytest.raises(ValueError, match="from the callback"):
        bp.Trainer(MODEL, output=runs_dir, **dict(TINY, steps=3)).train(DATA, callback=boom, progress=False)
    (run,) = bp.runs(runs_dir)
    assert run.status == "interrupted" and run.checkpoints, "stopped like Ctrl-C: a checkpoint"


def test_sigint_from_a_thread_saves_a_checkpoint_and_raises_keyboard_interrupt(runs_dir):
    t = bp.Trainer(MODEL, output=runs_dir, **dict(TINY, steps=4))
    sent = threading.Event()

    def send():
        os.kill(os.getpid(), signal.SIGINT)
        sent.set()

    def on_record(rec):
        if rec["type"] == "step" and rec["step"] == 1:
            threading.Thread(target=send).start()
            assert sent.wait(30)  # the signal arrives while this step's records are written

    with pytest.raises(KeyboardInterrupt) as e:
        t.train(DATA, callback=on_record, progress=False)
    (run,) = bp.runs(runs_dir)
    assert run.id in str(e.value) and "resume" in str(e.value)
    assert run.status == "interrupted" and run.checkpoints == ["checkpoint-1"]
    with pytest.raises(KeyboardInterrupt):  # Python's own handler is back: a plain KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGINT)
        threading.Event().wait(5)
    resumed = t.train(resume=run.id, progress=False)
    assert resumed.steps == 4 and resumed.run_id == run.id


def test_keyboard_interrupt_raised_in_python_stops_the_run_the_same_way(runs_dir):
    # interrupt_main() trips Python's own handler (no OS signal): the record callback's
    # PyErr_CheckSignals finds it and asks the trainer to stop.
    def on_record(rec):
        if rec["type"] == "step" and rec["step"] == 1:
            threading.Thread(target=_thread.interrupt_main).start()
            threading.Event().wait(0.2)

    with pytest.raises(KeyboardInterrupt) as e:
        bp.Trainer(MODEL, output=runs_dir, **dict(TINY, steps=6)).train(DATA, callback=on_record, progress=False)
    (run,) = bp.runs(runs_dir)
    assert run.id in str(e.value) and run.status == "interrupted" and run.checkpoints


def test_another_thread_runs_python_while_training(runs_dir):
    # With a 1 s switch interval the main thread never hands the GIL over while it runs Python
    # (callbacks are short): the waiting thread can only run while the C++ code has released it.
    go, ran = threading.Event(), threading.Event()
    seen = []

    def worker():
        go.wait()
        ran.set()

    def on_record(rec):
        if rec["type"] == "step" and rec["step"] == 1:
            go.set()
        seen.append(ran.is_set())

    threading.Thread(target=worker, daemon=True).start()
    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        bp.Trainer(MODEL, output=runs_dir, **dict(TINY, steps=3)).train(DATA, callback=on_record, progress=False)
    finally:
        sys.setswitchinterval(old)
    assert any(seen), "the other thread ran between two records, while the trainer worked"


def test_progress_lines_and_logging(runs_dir, capsys, caplog):
    caplog.set_level("INFO", logger="backpropagate")
    bp.Trainer(MODEL, output=runs_dir, **TINY).train(DATA, progress="plain")
    err = capsys.readouterr().err
    assert "[train] step 1/2" in err and "[train] step 2/2" in err
    assert any(r.name == "backpropagate" for r in caplog.records), "the library's log lines reach logging"


def test_progress_bar_with_tqdm(runs_dir, capsys):
    pytest.importorskip("tqdm")
    bp.Trainer(MODEL, output=runs_dir, **TINY).train(DATA)
    err = capsys.readouterr().err
    assert "train" in err and "2/2" in err and "loss" in err
