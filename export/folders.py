"""What every export does with its folders: a step's graph in a working folder of its own, the
staged export moved into `--out`, and the size past which a graph keeps its weights apart."""

from __future__ import annotations

import datetime as _dt
import shutil
from pathlib import Path

EXTERNAL_DATA_BYTES = 1_800_000_000  # protobuf's hard limit is 2 GiB for the whole file


def step_path(tmp_dir: Path, step: str) -> Path:
    """`tmp_dir/step/model.onnx`, its folder made: where the export's step `step` writes its graph."""
    folder = tmp_dir / step
    folder.mkdir()
    return folder / "model.onnx"


def move_into(stage: Path, out: Path) -> None:
    """Every file of `stage` into `out` (made if needed), in place of any of the same name."""
    out.mkdir(parents=True, exist_ok=True)
    for item in stage.iterdir():
        target = out / item.name
        if target.exists():
            target.unlink() if target.is_file() else shutil.rmtree(target)
        shutil.move(str(item), str(target))


def exported_with() -> dict:
    """What a manifest records of the tools that made the export, and when."""
    import onnx
    import onnxruntime
    import torch
    import transformers

    import engine

    return {
        "engine": engine.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def created() -> str:
    """The export's time, UTC, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
