"""A sentence-embedding checkpoint -> an ONNX text encoder for retrieval (`prune index`).

Output folder:
    encoder.onnx     input_ids, attention_mask [batch, sequence] -> embedding [batch, dim]
                     (the checkpoint's pooling, mean or CLS, then L2-normalised)
    tokenizer.json   the checkpoint's own tokenizer
    encoder.json     format, dimension, window, pooling, pad id, source, measured parity

The window is the checkpoint's `sentence_bert_config.json` `max_seq_length` where it has
one (256 for all-MiniLM-L6-v2, what sentence-transformers encodes with), else the model's.
The graph is checked against the PyTorch module on sample texts before it is kept.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import engine
from engine.rag.embedder import ENCODER_FILE, ENCODER_FORMAT, ENCODER_GRAPH
from engine.errors import ExportError

PARITY_TOLERANCE = 1e-5  # max |diff| of an embedding component, ONNX Runtime vs PyTorch fp32

SAMPLE_TEXTS = [
    "What goes on the bottom of Shepherd's pie?",
    "The pie dish was lined on the sides and bottom with mashed potato.",
    " ".join(f"Sentence {i} is about the weather in 2020 and a price of 3.50 dollars." for i in range(12)),
    "北京是中国的首都。The museum opened a new exhibition.",
]


class _EncoderModule(torch.nn.Module):
    def __init__(self, backbone: torch.nn.Module, pooling: str):
        super().__init__()
        self.backbone, self.pooling = backbone, pooling

    def forward(self, input_ids, attention_mask):
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids)
        )[0].to(torch.float32)
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            w = attention_mask.to(torch.float32).unsqueeze(-1)
            pooled = (hidden * w).sum(1) / w.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)


#: the files fastembed reads from a model folder besides the graph (plain_backbone)
PLAIN_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json")


def model_window(folder: Path, model_window: int) -> int:
    """The window sentence-transformers encodes with: its config's max_seq_length, within
    the model's own."""
    cfg = folder / "sentence_bert_config.json"
    if cfg.is_file():
        value = json.loads(cfg.read_text()).get("max_seq_length")
        if isinstance(value, int) and 8 <= value:
            return min(value, model_window)
    return model_window


def _feeds(tok: Any, texts: list[str], pad_id: int, window: int) -> dict[str, np.ndarray]:
    ids = [e.ids[:window] for e in tok.encode_batch(texts)]
    length = max(len(i) for i in ids)
    input_ids = np.full((len(ids), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(ids), length), dtype=np.int64)
    for r, row in enumerate(ids):
        input_ids[r, : len(row)] = row
        mask[r, : len(row)] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


def export_encoder(
    checkpoint: str | Path,
    out: str | Path,
    *,
    overwrite: bool = False,
    name: str | None = None,
    opset: int = 17,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Export the text encoder of a sentence-embedding checkpoint into `out`; returns the
    manifest (encoder.json). `name` is recorded in the collections `prune index` builds
    (default: the checkpoint folder's name). Raises ExportError if ONNX Runtime disagrees
    with PyTorch."""
    from engine.pytorch.torch_model import load_torch_model

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ExportError(
            f"{out} exists and is not empty: choose another --out, or --overwrite to write into it"
        )
    t0 = time.perf_counter()
    tm = load_torch_model(checkpoint, family="embedding")
    model, tok, spec, ck = tm.module, tm.tokenizer, tm.spec, tm.checkpoint
    window = model_window(Path(ck.folder), spec.max_length)
    module = _EncoderModule(model.encoder, model.pooling).eval()
    pad_id = int(spec.pad_id)
    example = _feeds(tok, SAMPLE_TEXTS[:2], pad_id, window)
    with tempfile.TemporaryDirectory(prefix="prune-encoder-") as tmp:
        stage = Path(tmp) / "out"
        stage.mkdir()
        graph = stage / ENCODER_GRAPH
        try:
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # tracer warnings; the parity check decides
                torch.onnx.export(
                    module,
                    (torch.from_numpy(example["input_ids"]), torch.from_numpy(example["attention_mask"])),
                    str(graph),
                    input_names=["input_ids", "attention_mask"],
                    output_names=["embedding"],
                    dynamic_axes={
                        "input_ids": {0: "batch", 1: "sequence"},
                        "attention_mask": {0: "batch", 1: "sequence"},
                        "embedding": {0: "batch"},
                    },
                    opset_version=opset,
                    do_constant_folding=True,
                    dynamo=False,
                )
        except Exception as exc:
            raise ExportError(f"torch.onnx.export failed: {type(exc).__name__}: {exc}") from exc
        tok.save(str(stage / "tokenizer.json"))
        import onnxruntime as ort

        session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        worst = 0.0
        for texts in (SAMPLE_TEXTS[:1], SAMPLE_TEXTS):
            feed = _feeds(tok, texts, pad_id, window)
            with torch.inference_mode():
                ref = module(*(torch.from_numpy(feed[n]) for n in ("input_ids", "attention_mask"))).numpy()
            got = session.run(None, feed)[0]
            worst = max(worst, float(np.abs(ref - got).max()))
        if worst > PARITY_TOLERANCE:
            raise ExportError(
                f"the ONNX encoder differs from PyTorch by {worst:.2e} (tolerance {PARITY_TOLERANCE:.0e})"
            )
        manifest = {
            "format": ENCODER_FORMAT,
            "graph": ENCODER_GRAPH,
            "tokenizer": "tokenizer.json",
            "dim": int(ref.shape[1]),
            "max_length": int(window),
            "pooling": model.pooling,
            "normalized": True,
            "pad_id": pad_id,
            "name": name or Path(str(checkpoint)).name,
            "source": {"checkpoint": str(checkpoint)},
            "verification": {"max_abs_diff_embedding": worst, "tolerance": PARITY_TOLERANCE},
            "exported_with": {
                "engine": engine.__version__,
                "torch": torch.__version__,
                "onnxruntime": ort.__version__,
            },
        }
        (stage / ENCODER_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(stage, out)
    log(
        f"exported the {manifest['dim']}-dim encoder ({model.pooling} pooling, window {window}) "
        f"to {out} in {time.perf_counter() - t0:.1f} s; max |diff| vs PyTorch {worst:.2e}"
    )
    return manifest


def plain_backbone(checkpoint: str | Path, folder: Path, opset: int = 17) -> Path:
    """The checkpoint's backbone exported plainly into `folder` (model.onnx: input_ids,
    attention_mask, token_type_ids -> last_hidden_state; the tokenizer files beside it), as
    the bench's peers (fastembed) load a model. Weights are read from safetensors only.
    Returns the folder."""
    import torch
    from transformers import AutoModel

    src = Path(checkpoint)
    folder.mkdir(parents=True, exist_ok=True)
    backbone = AutoModel.from_pretrained(checkpoint, use_safetensors=True, attn_implementation="eager").eval()

    class Plain(torch.nn.Module):  # keyword arguments: the backbone's positional order varies
        def __init__(self):
            super().__init__()
            self.backbone = backbone

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.backbone(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    model = Plain()
    ids = torch.ones(2, 8, dtype=torch.long)
    graph = folder / "model.onnx"
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on transformers' mask code
        torch.onnx.export(
            model,
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(graph),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={
                n: {0: "batch", 1: "sequence"}
                for n in ("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")
            },
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    for name in PLAIN_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, folder / name)
    # fastembed truncates at tokenizer_config's model_max_length and refuses a folder
    # without one: where it is missing, the window sentence-transformers encodes with
    tok_config = folder / "tokenizer_config.json"
    conf = json.loads(tok_config.read_text()) if tok_config.is_file() else {}
    if not isinstance(conf.get("model_max_length"), int) or conf["model_max_length"] > 10**6:
        conf["model_max_length"] = model_window(src, int(backbone.config.max_position_embeddings))
        tok_config.write_text(json.dumps(conf, indent=2) + "\n")
    return folder


def plain_backbone_int8(plain: Path, folder: Path) -> Path:
    """A `plain_backbone` folder's graph through ONNX Runtime's dynamic quantization at its
    defaults (int8 weights per tensor) into `folder`, the tokenizer files copied. Returns it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder.mkdir(parents=True, exist_ok=True)
    quantize_dynamic(str(plain / "model.onnx"), str(folder / "model.onnx"), weight_type=QuantType.QInt8)
    for name in PLAIN_FILES:
        if (plain / name).is_file():
            shutil.copyfile(plain / name, folder / name)
    return folder
