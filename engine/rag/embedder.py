"""Text -> embedding vectors for retrieval, with ONNX Runtime and tokenizers only (no torch).

An encoder folder is what `export.backbone.export_encoder` writes (`prune export --encoder`):
encoder.onnx, tokenizer.json and encoder.json. `Embedder.load("default")` is the default
model's encoder (all-MiniLM-L6-v2), exported into the cache on first use.

A text longer than the encoder's window is refused with its length (`prune index` chunks
documents to fit: engine.rag.retrieval.chunk_spans), unless the caller asks for it to be cut
to the window (`truncate`), as Milvus's Embedding calls do (engine/http/milvus.py: counted
and logged there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from engine.backends.onnxruntime import thread_denormals
from engine.errors import InputError, ModelLoadError
from engine.cancellation import check_cancelled

ENCODER_FILE = "encoder.json"
ENCODER_GRAPH = "encoder.onnx"
ENCODER_FORMAT = "prune-engine-encoder/1"
BATCH_SIZE = 8  # measured: 41 texts/s at 8, 36 at 32 (MiniLM, 2 cores, ~150 tokens)


def default_encoder_dir() -> Path:
    """The cached export of the default retrieval encoder."""
    from engine.models.default_model import default_model_dir

    base = default_model_dir()
    return base.with_name(base.name + "-encoder")


def ensure_default_encoder(log: Callable[[str], None] | None = None) -> Path:
    """The default model's exported encoder folder, exporting it first if needed."""
    from engine.models.default_model import (
        DEFAULT_MODEL,
        default_checkpoint,
        export_into_cache,
        exporter,
        stderr_log,
    )

    target = default_encoder_dir()
    if (target / ENCODER_FILE).is_file():
        return target
    log = log or stderr_log
    export_encoder = exporter(
        "export.backbone", "export_encoder", "the default encoder", "pass an exported encoder"
    )
    source = default_checkpoint()
    log(
        f"first use: exporting the encoder of {DEFAULT_MODEL} from {source} to {target} (once, about 10 s) ..."
    )
    return export_into_cache(
        target,
        ENCODER_FILE,
        lambda staging: export_encoder(
            source,
            staging,
            name=DEFAULT_MODEL,
            log=lambda m: log("  " + m.replace(str(staging), str(target))),
        ),
    )


class Embedder:
    """L2-normalised embeddings of texts; `encode(texts)` -> float32 [n, dim]."""

    def __init__(self, folder: Path, manifest: dict, session, tokenizer, runs=None, flush: bool = False):
        self.folder, self.manifest, self.flush = folder, manifest, flush
        self.session, self.tokenizer, self.runs = session, tokenizer, runs
        self.dim = int(manifest["dim"])
        self.max_length = int(manifest["max_length"])
        self.pad_id = int(manifest["pad_id"])
        self.name = str(manifest.get("name") or folder.name)

    @classmethod
    def load(
        cls,
        path: str | Path = "default",
        *,
        threads: int | None = None,
        log: Callable[[str], None] | None = None,
    ) -> "Embedder":
        """The encoder exported in `path` ('default': exported on first use)."""
        folder = (
            ensure_default_encoder(log)
            if str(path) == "default" and not Path("default").exists()
            else Path(path)
        )
        manifest_path = folder / ENCODER_FILE
        if not manifest_path.is_file():
            raise ModelLoadError(
                f"{folder}: not an exported encoder (no {ENCODER_FILE}); make one with "
                "prune export --encoder --model CHECKPOINT --out FOLDER"
            )
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("format") != ENCODER_FORMAT:
            raise ModelLoadError(
                f"{manifest_path}: format {manifest.get('format')!r}, expected {ENCODER_FORMAT!r}"
            )
        from tokenizers import Tokenizer
        from engine.backends.onnxruntime import ort_session
        from engine.models.loading import LoadOptions

        o = LoadOptions.from_env(threads=threads)  # PRUNE_INTRA_OP_THREADS, PRUNE_ORT_ARENA, ..._DENORMALS
        made = ort_session(
            folder / manifest["graph"], intra_op_threads=o.threads, arena=o.arena, denormals=o.denormals
        )
        tokenizer = Tokenizer.from_file(str(folder / manifest["tokenizer"]))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return cls(folder, manifest, made.session, tokenizer, made.runs, flush=made.flush)

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text without the special tokens."""
        return [len(e.ids) for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """Character span of each token of `text` (no special tokens)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).offsets)

    def encode(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = BATCH_SIZE,
        what: str = "text",
        truncate: str | None = None,
    ) -> np.ndarray:
        """L2-normalised embeddings of `texts`, [N, dim] float32 (`tokenize`, then `embed`)."""
        return self.embed(self.tokenize(texts, truncate=truncate, what=what)[0], batch_size=batch_size)

    def tokenize(
        self, texts: Sequence[str], *, truncate: str | None = None, what: str = "text"
    ) -> tuple[list[list[int]], list[int]]:
        """(each text's token ids, special tokens included; the indices of the texts cut to the
        window). A text over the window is an InputError naming it, unless `truncate` says
        which end to keep: "right" its start (as sentence-transformers and TEI's `truncate`
        cut), "left" its end; its special tokens are kept either way."""
        ids, cut = [], []
        for i, e in enumerate(self.tokenizer.encode_batch(list(texts))):
            if len(e.ids) > self.max_length:
                if truncate is None:
                    raise InputError(
                        f"{what} {i} is {len(e.ids)} tokens; the encoder {self.name} reads at "
                        f"most {self.max_length} (special tokens included)"
                    )
                ids.append(cut_to(e.ids, e.special_tokens_mask, self.max_length, keep_end=truncate == "left"))
                cut.append(i)
            else:
                ids.append(e.ids)
        return ids, cut

    def embed(self, ids: Sequence[Sequence[int]], *, batch_size: int = BATCH_SIZE) -> np.ndarray:
        """L2-normalised embeddings of token id sequences (`tokenize`'s), [N, dim] float32; a
        caller that gave up on the call (engine.cancellation.check_cancelled) stops it between two batches."""
        out = np.zeros((len(ids), self.dim), dtype=np.float32)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # little padding
        for b in range(0, len(order), batch_size):
            check_cancelled()
            rows = order[b : b + batch_size]
            length = max(len(ids[i]) for i in rows)
            batch = np.full((len(rows), length), self.pad_id, dtype=np.int64)
            mask = np.zeros((len(rows), length), dtype=np.int64)
            for r, i in enumerate(rows):
                batch[r, : len(ids[i])] = ids[i]
                mask[r, : len(ids[i])] = 1
            with thread_denormals(self.flush):
                out[rows] = self.session.run(
                    None,
                    {"input_ids": batch, "attention_mask": mask},
                    self.runs(batch.size) if self.runs else None,
                )[0]
        return out


def cut_to(ids: Sequence[int], special: Sequence[int], max_length: int, keep_end: bool = False) -> list[int]:
    """`ids` cut to `max_length` tokens, its leading and trailing special tokens kept ([CLS]
    ... [SEP]): the text's first tokens, or its last with `keep_end`."""
    head = next((k for k, m in enumerate(special) if not m), len(ids))
    tail = next((k for k, m in enumerate(reversed(special)) if not m), 0)
    body = list(ids[head : len(ids) - tail])
    room = max(1, max_length - head - tail)
    body = body[len(body) - room :] if keep_end else body[:room]
    return list(ids[:head]) + body + list(ids[len(ids) - tail :])
