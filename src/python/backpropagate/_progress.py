"""Progress of a training run: tqdm's bar when tqdm is installed (a widget in Jupyter through
tqdm.auto), plain lines on stderr otherwise. Fed with the step records of metrics.jsonl."""

import sys


def _describe(rec):
    parts = []
    if rec.get("loss") is not None:
        parts.append(f"loss {rec['loss']:.4f}")
    if rec.get("lr") is not None:
        parts.append(f"lr {rec['lr']:.1e}")
    if rec.get("bytes_in_use") is not None:
        parts.append(f"mem {rec['bytes_in_use'] / 2**30:.2f} GiB")
    return " ".join(parts)


class Progress:
    def __init__(self, enabled, stream=None):
        """enabled: True (tqdm when installed, else plain lines), "plain", or False."""
        self.enabled = bool(enabled)
        self.stream = stream or sys.stderr
        self.bar = None
        self.tqdm = None
        if enabled is True:
            try:
                from tqdm.auto import tqdm  # noqa: PLC0415 (optional dependency)

                self.tqdm = tqdm
            except ImportError:
                self.tqdm = None

    def update(self, rec, total):
        if not self.enabled or rec.get("type") != "step":
            return
        step = rec.get("step", 0)
        if self.tqdm is not None:
            if self.bar is None:
                self.bar = self.tqdm(total=total, initial=step - 1, desc="train", unit="step")
            self.bar.set_postfix_str(_describe(rec), refresh=False)
            self.bar.update(step - self.bar.n)
            return
        every = max(1, total // 20)
        if step == 1 or step == total or step % every == 0:
            print(f"[train] step {step}/{total} {_describe(rec)}", file=self.stream, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
