"""Triton model-repository templates, shipped as package data (read, never imported):

- `python_core/model.py`: the CPU core model (python backend running ONNX Runtime);
- `python_text/model.py`: the text model (text in, pruned text out; BLS to the core);
- `python_compress/model.py`: an LLMLingua-2 compressor's text model (a JSON call in, llmlingua's
  result out; BLS to its core, which is `python_core` too).

`prune repository` (export/triton_repository.py) copies them into a repository with `template()`.
"""

from importlib.resources import files
from pathlib import Path

CORE = "python_core"
TEXT = "python_text"
COMPRESS = "python_compress"


def template(name: str) -> Path:
    """The `model.py` of template `name`, where this package is installed."""
    path = Path(str(files(__name__) / name / "model.py"))
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the {name} template is missing from this installation (reinstall prune-engine)"
        )
    return path
