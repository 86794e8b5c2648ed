"""The tools a user would pick instead of the engine for the embedding family's job, on the
same checkpoint and the same calls (`prune bench`'s peer paths).

Each peer embeds the question and every sentence of a call's passages (split as the engine
splits them), L2-normalised, and takes each sentence's cosine with the question: the
embedding family's job without the decisions.

- sentence-transformers (PyTorch fp32), one `encode` per call: [default-model] installs it;
- fastembed (ONNX Runtime) on the checkpoint exported plainly, as the hub's ONNX files of
  sentence-transformers models are (the backbone's `last_hidden_state`, no fusions written
  into the file; ONNX Runtime applies its own at load), fp32 and dynamic int8 (ONNX
  Runtime's `quantize_dynamic` at its defaults: int8 weights per tensor, what optimum's
  avx512_vnni configuration writes): [bench] installs it.

sentence-transformers' own ONNX backend needs optimum-onnx, which pins transformers<4.58
(the export needs 5.x): it does not install beside the engine and is not a peer here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

#: texts per batch, for every peer (sentence-transformers' `encode` default is 32; the
#: engine's batches are larger, so the peers get 64 too)
BATCH = 64


def call_texts(question: str, passages: list[str]) -> tuple[list[str], list[int]]:
    """A call's texts for a peer: the question, then every sentence of every passage (split
    as the engine splits them); and each passage's sentence count."""
    from engine.text import split_sentences
    sents = [[p[a:b] for a, b in split_sentences(p)] for p in passages]
    return [question] + [x for ss in sents for x in ss], [len(ss) for ss in sents]


@dataclass
class CosinePeer:
    """A peer. `embed(texts) -> [n, dim]` normalised; `shapes(texts)`: the padded batches
    (rows, length) its library sends for those texts, for the limit share; `graph`: an ONNX
    graph of the same network (its work per token); `precision`: "fp32" or "int8"."""
    embed: Callable[[list[str]], np.ndarray]
    shapes: Callable[[list[str]], list[tuple[int, int]]]
    graph: Path | None = None
    precision: str = "fp32"

    def prune(self, question: str, passages: list[str]) -> list[np.ndarray]:   # run_sequential's call
        """Each passage's sentence scores from the peer's embeddings."""
        texts, counts = call_texts(question, passages)
        emb = self.embed(texts)
        cos = emb[1:] @ emb[0]
        bounds = np.cumsum([0] + counts)
        return [cos[bounds[i]:bounds[i + 1]] for i in range(len(passages))]


def sentence_transformers_peer(checkpoint: str, device: str = "cpu", graph: Path | None = None) -> CosinePeer | None:
    """sentence-transformers on the checkpoint, the question and every sentence of a call in
    one `encode` (batches of 64 after its own sort by length). None when
    sentence-transformers is not installed."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    model = SentenceTransformer(checkpoint, device=device)

    def shapes(texts: list[str]) -> list[tuple[int, int]]:
        ordered = [texts[i] for i in np.argsort([-len(t) for t in texts], kind="stable")]
        return [tuple(model.preprocess(ordered[i:i + BATCH])["input_ids"].shape) for i in range(0, len(ordered), BATCH)]
    return CosinePeer(lambda texts: model.encode(texts, batch_size=BATCH, normalize_embeddings=True,
                                                 convert_to_numpy=True, show_progress_bar=False), shapes, graph)


def fastembed_peer(folder: Path, pooling: str = "mean", threads: int | None = None,
                   precision: str = "fp32") -> CosinePeer | None:
    """fastembed's TextEmbedding on a `export.embedder.plain_backbone` folder (read from disk, never
    downloaded), CPU provider, `threads` intra-op threads (None: ONNX Runtime's default),
    batches of 64 in input order. None when fastembed is not installed."""
    try:
        from fastembed import TextEmbedding
        from fastembed.common.model_description import ModelSource, PoolingType
    except ImportError:
        return None
    name = f"prune-bench/{folder.resolve()}"      # one registration per folder
    if all(m["model"] != name for m in TextEmbedding.list_supported_models()):
        dim = json.loads((folder / "config.json").read_text())["hidden_size"]
        TextEmbedding.add_custom_model(model=name, pooling=PoolingType.CLS if pooling == "cls" else PoolingType.MEAN,
                                       normalization=True, sources=ModelSource(hf=name), dim=dim,
                                       model_file="model.onnx")
    model = TextEmbedding(model_name=name, specific_model_path=str(folder), threads=threads,
                          providers=["CPUExecutionProvider"])
    tokenizer = model.model.tokenizer              # fastembed's own, with its truncation and padding

    def shapes(texts: list[str]) -> list[tuple[int, int]]:
        return [(len(chunk), len(tokenizer.encode_batch(chunk)[0].ids))
                for chunk in (texts[i:i + BATCH] for i in range(0, len(texts), BATCH))]
    return CosinePeer(lambda texts: np.stack(list(model.embed(texts, batch_size=BATCH))), shapes,
                      folder / "model.onnx", precision)


def embedding_peers(checkpoint: str, folder: Path, device: str = "cpu", threads: int | None = None,
                    log: Callable[[str], None] = print) -> dict[str, CosinePeer]:
    """Every peer that installs here, by its bench path name; the plain exports go under
    `folder`. A peer that does not install is logged with what to install."""
    from engine.pytorch.embedding import _pooling
    peers: dict[str, CosinePeer] = {}
    plain = folder / "fp32"
    fastembed_ok = device == "cpu"
    try:
        import fastembed  # noqa: F401
    except ImportError:
        fastembed_ok = False
        log("peer fastembed: not installed (pip install 'prune-engine[bench]'): not measured")
    if fastembed_ok:
        log("peers: exporting the checkpoint plainly (fp32, dynamic int8) for fastembed ...")
        from export.embedder import plain_backbone, plain_backbone_int8
        plain_backbone(checkpoint, plain)
        plain_backbone_int8(plain, folder / "int8")
        pooling = _pooling(Path(checkpoint)) if Path(checkpoint).is_dir() else "mean"
        peers["peer: fastembed (ONNX Runtime fp32, plain export; embed + cosine, no decisions)"] = \
            fastembed_peer(plain, pooling, threads)
        peers["peer: fastembed (ONNX Runtime int8 dynamic, per-tensor weights; embed + cosine, no decisions)"] = \
            fastembed_peer(folder / "int8", pooling, threads, precision="int8")
    st = sentence_transformers_peer(checkpoint, device, plain / "model.onnx" if fastembed_ok else None)
    if st is None:
        log("peer sentence-transformers: not installed (pip install 'prune-engine[default-model]'): not measured")
    else:
        peers["peer: sentence-transformers (torch fp32; encode + cosine, no decisions)"] = st
    return peers
