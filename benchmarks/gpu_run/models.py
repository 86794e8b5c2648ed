"""The GPU run's models: random-weight Provence-size checkpoints (speed does not depend
on the weights), and their exports by `prune export`, each in a process of its own (so
that one can run in the background on the CPU while the GPU measures, and so that the
budget can stop it), reused where the folder already holds an export of the same
checkpoint at the same precision."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

SIZE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def checkpoint(folder: Path, sizes: dict, label: str) -> tuple[Path, dict]:
    """A Provence test checkpoint with `sizes` in `folder` (the one already there when
    its config has these sizes), and its row for the report."""
    t0 = time.time()
    config = folder / "config.json"
    if config.is_file() and list(folder.glob("*.safetensors")):
        have = json.loads(config.read_text())
        if all(have.get(k) == v for k, v in sizes.items()):
            return folder, {
                "kind": "checkpoint",
                "model": label,
                "seconds": time.time() - t0,
                "reused": True,
                "reused_because": "its config has the same sizes",
            }
    from export.checkpoints import make_test_checkpoint

    make_test_checkpoint("provence", folder, sizes=sizes)
    return folder, {"kind": "checkpoint", "model": label, "seconds": time.time() - t0, "reused": False}


def weights_sha256(folder: Path) -> str:
    """sha256 over the checkpoint's weight files, as the export's manifest records it."""
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    digest = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                digest.update(chunk)
    return digest.hexdigest()


def not_reusable(out: Path, ck: Path, precision: str, sha: str | None = None) -> str | None:
    """Why the export in `out` cannot stand for `ck` at `precision` (None: it can): its
    manifest must name this checkpoint, its weights' sha256 and this precision, and its
    graph must be there."""
    manifest = out / "manifest.json"
    if not manifest.is_file():
        return "no export there"
    try:
        data = json.loads(manifest.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return f"unreadable manifest ({exc})"
    source = data.get("source") or {}
    if data.get("precision") != precision:
        return f"its precision is {data.get('precision')}"
    if source.get("checkpoint") != str(ck.resolve()):
        return f"it was exported from {source.get('checkpoint')}"
    if not (out / str(data.get("graph", "model.onnx"))).is_file():
        return "its graph is missing"
    if source.get("weights_sha256") != (sha or weights_sha256(ck)):
        return "the checkpoint's weights changed since"
    return None


def export_command(ck: Path, out: Path, precision: str) -> list[str]:
    """`prune export` of `ck` into `out` at `precision` (no parity run: this is a speed
    measurement; its fidelity is the run's own check against fp32 PyTorch)."""
    return [
        sys.executable,
        "-m",
        "engine",
        "export",
        "--model",
        str(ck),
        "--out",
        str(out),
        "--precision",
        precision,
        "--no-verify",
        "--overwrite",
    ]


class Export:
    """One `prune export` for the run: reused when `out` already holds it, else run as a
    process (`begin`), waited for until a deadline (`wait`), stopped when the budget
    says so (`stop`); `row()` is its line in the report, the export time included."""

    def __init__(
        self,
        label: str,
        ck: Path,
        out: Path,
        precision: str,
        logs: Path,
        log: Callable[[str], None],
        background: bool = False,
    ):
        self.label, self.ck, self.out, self.precision = label, ck, out, precision
        self.logs, self.log, self.background = logs, log, background
        self.proc: subprocess.Popen | None = None
        self.began = self.ended = None
        self.reused = False
        self.why: str | None = None  # reused because / not reusable because
        self.failed: str | None = None
        self.stopped: str | None = None

    def begin(self) -> "Export":
        """Reuse the export in `out`, or start `prune export` into it."""
        self.began = time.time()
        why = not_reusable(self.out, self.ck, self.precision)
        if why is None:
            self.reused, self.ended = True, time.time()
            self.why = "its manifest names the same checkpoint, weights and precision"
            self.log(
                f"{self.label} {self.precision}: reusing the export in {self.out} ({self.why}): not exported again"
            )
            return self
        self.log(f"{self.label} {self.precision}: exporting ({why} in {self.out}) ...")
        self.logs.mkdir(parents=True, exist_ok=True)
        name = f"export-{self.label.replace(' ', '-')}-{self.precision}.log"
        with open(self.logs / name, "w") as fh:
            self.proc = subprocess.Popen(
                export_command(self.ck, self.out, self.precision), stdout=fh, stderr=subprocess.STDOUT
            )
        return self

    def running(self) -> bool:
        """Whether its process is still running."""
        if self.proc is None or self.ended is not None:
            return False
        code = self.proc.poll()
        if code is None:
            return True
        self._ended(code)
        return False

    def _ended(self, code: int) -> None:
        self.ended = time.time()
        if code != 0 and self.stopped is None:
            log = self.logs / f"export-{self.label.replace(' ', '-')}-{self.precision}.log"
            tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.is_file() else []
            self.failed = f"prune export exited with {code}: {' / '.join(tail)[-400:]}"
            self.log(f"{self.label} {self.precision}: {self.failed}")
        elif code == 0:
            self.log(f"{self.label} {self.precision}: exported in {self.seconds:.0f} s")

    def wait(self, deadline: float, why: str = "the budget was spent") -> bool:
        """Wait until it ends or `deadline` (time.time()); stopped there. Whether the
        export is ready."""
        while self.running():
            if time.time() >= deadline:
                self.stop(why)
                break
            time.sleep(0.2)
        return self.ready

    def stop(self, why: str) -> None:
        """Stop a running export (SIGINT, so it removes its temporary folder; then kill)."""
        if not self.running():
            return
        self.stopped = f"stopped after {time.time() - self.began:.0f} s: {why}"
        self.log(f"{self.label} {self.precision}: {self.stopped}")
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._ended(self.proc.returncode)

    @property
    def ready(self) -> bool:
        """Whether the export is there to measure."""
        return self.reused or (self.ended is not None and not self.failed and not self.stopped)

    @property
    def seconds(self) -> float | None:
        """How long it took (or has taken so far)."""
        if self.began is None:
            return None
        return (self.ended or time.time()) - self.began

    def row(self) -> dict:
        """Its line in the report."""
        row = {
            "kind": "export",
            "model": self.label,
            "precision": self.precision,
            "seconds": self.seconds,
            "reused": self.reused,
            "background": self.background,
            "folder": str(self.out),
        }
        if self.reused:
            row["reused_because"] = self.why
        if self.failed:
            row["error"] = self.failed
        elif self.stopped:
            row["skipped"] = self.stopped
        elif self.began is None:
            row["skipped"] = "not started: the budget was spent"
        elif self.ended is None:
            row["skipped"] = f"still running after {self.seconds:.0f} s"
        return row


def config(ck: Path) -> dict:
    """The checkpoint's configuration (its vocabulary and sizes: the FLOP count's)."""
    return json.loads((ck / "config.json").read_text())


def load_module(ck: Path, attn: str):
    """The checkpoint's PyTorch module (fp32, CPU), or the error in words."""
    from engine.pytorch.torch_model import load_torch_model

    try:
        return load_torch_model(ck, attn=attn).module.eval()
    except Exception as exc:  # an attention implementation DeBERTa lacks
        return f"{type(exc).__name__}: {str(exc)[:300]}"
