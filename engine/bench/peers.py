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

- sentence-transformers' ONNX backend with its own dynamic INT8 export, and its OpenVINO
  backend with its own static INT8 export: they need optimum (optimum-onnx, optimum-intel),
  which pins transformers<4.58 (the engine's export needs 5.x), so they run in an
  environment of their own, `prune bench --peer-python PYTHON` (`remote_peer`, one process
  each, engine/bench/peer_worker.py; docs/installing.md says how to make it).
"""

from __future__ import annotations

import json
import subprocess
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
    from engine.pipeline.text import split_sentences

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

    def prune(self, question: str, passages: list[str]) -> list[np.ndarray]:  # run_sequential's call
        """Each passage's sentence scores from the peer's embeddings."""
        texts, counts = call_texts(question, passages)
        emb = self.embed(texts)
        cos = emb[1:] @ emb[0]
        bounds = np.cumsum([0] + counts)
        return [cos[bounds[i] : bounds[i + 1]] for i in range(len(passages))]


def sentence_transformers_peer(
    checkpoint: str, device: str = "cpu", graph: Path | None = None
) -> CosinePeer | None:
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
        return [
            tuple(model.preprocess(ordered[i : i + BATCH])["input_ids"].shape)
            for i in range(0, len(ordered), BATCH)
        ]

    return CosinePeer(
        lambda texts: model.encode(
            texts, batch_size=BATCH, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        ),
        shapes,
        graph,
    )


def fastembed_peer(
    folder: Path, pooling: str = "mean", threads: int | None = None, precision: str = "fp32"
) -> CosinePeer | None:
    """fastembed's TextEmbedding on a `export.backbone.plain_backbone` folder (read from disk, never
    downloaded), CPU provider, `threads` intra-op threads (None: ONNX Runtime's default),
    batches of 64 in input order. None when fastembed is not installed."""
    try:
        from fastembed import TextEmbedding
        from fastembed.common.model_description import ModelSource, PoolingType
    except ImportError:
        return None
    name = f"prune-bench/{folder.resolve()}"  # one registration per folder
    if all(m["model"] != name for m in TextEmbedding.list_supported_models()):
        dim = json.loads((folder / "config.json").read_text())["hidden_size"]
        TextEmbedding.add_custom_model(
            model=name,
            pooling=PoolingType.CLS if pooling == "cls" else PoolingType.MEAN,
            normalization=True,
            sources=ModelSource(hf=name),
            dim=dim,
            model_file="model.onnx",
        )
    model = TextEmbedding(
        model_name=name, specific_model_path=str(folder), threads=threads, providers=["CPUExecutionProvider"]
    )
    tokenizer = model.model.tokenizer  # fastembed's own, with its truncation and padding

    def shapes(texts: list[str]) -> list[tuple[int, int]]:
        return [
            (len(chunk), len(tokenizer.encode_batch(chunk)[0].ids))
            for chunk in (texts[i : i + BATCH] for i in range(0, len(texts), BATCH))
        ]

    return CosinePeer(
        lambda texts: np.stack(list(model.embed(texts, batch_size=BATCH))),
        shapes,
        folder / "model.onnx",
        precision,
    )


#: what the `--peer-python` environment holds (docs/installing.md): torch pinned as the
#: engine's is (a looser pin may pull a CUDA build), optimum through sentence-transformers'
#: extras (it resolves to the last release whose extras install: 5.7 with transformers 4.57),
#: `datasets` for the OpenVINO export's calibration set
PEER_ENV = ("torch==2.13.0", "sentence-transformers[onnx,openvino]", "datasets")

#: sentence-transformers' backends run by `--peer-python`: bench path name -> peer_worker's --backend
REMOTE_PEERS = {
    "onnx": "peer: sentence-transformers ONNX backend (its dynamic int8 export, optimum; encode + cosine, "
    "no decisions)",
    "openvino": "peer: sentence-transformers OpenVINO backend (its static int8 export, NNCF; encode + cosine, "
    "no decisions)",
}


class RemotePeer:
    """peer_worker.py in another interpreter: texts out, normalised embeddings back, one
    JSON line each way (the pipe's cost is part of what is timed: about a millisecond a
    call against tens of milliseconds of encoding)."""

    def __init__(
        self,
        python: str,
        checkpoint: str,
        backend: str,
        work: Path,
        int8_config: str = "avx2",
        calibration: Path | None = None,
        timeout: float = 900.0,
    ):
        worker = Path(__file__).with_name("peer_worker.py")
        cmd = [
            python,
            str(worker),
            "--checkpoint",
            str(checkpoint),
            "--backend",
            backend,
            "--work",
            str(work),
            "--int8-config",
            int8_config,
        ] + (["--calibration", str(calibration)] if calibration else [])
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.communicate(timeout=timeout)[1]
            raise RuntimeError(f"peer {backend} ({python}) did not start:\n{err[-3000:]}")
        self.model = json.loads(line)["model"]

    def embed(self, texts: list[str]) -> np.ndarray:
        """The worker's embeddings of `texts`, [n, dim] float32."""
        import base64

        self.proc.stdin.write(json.dumps({"texts": texts}) + "\n")
        self.proc.stdin.flush()
        got = json.loads(self.proc.stdout.readline())
        return np.frombuffer(base64.b64decode(got["emb"]), dtype=np.float32).reshape(got["n"], got["dim"])

    def close(self) -> None:
        """End the worker."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(60)


def int8_config() -> str:
    """sentence-transformers' dynamic INT8 configuration for this CPU (its documentation
    names one per instruction set: avx512_vnni, avx512, avx2, arm64)."""
    from engine.machine.cpu import CpuKind

    kind = CpuKind.here()
    if kind.int8_dot and "avx512f" in kind.flags:
        return "avx512_vnni"
    return "avx512" if "avx512f" in kind.flags else "avx2"


def remote_peers(
    python: str,
    checkpoint: str,
    folder: Path,
    log: Callable[[str], None] = print,
    backends: tuple[str, ...] = tuple(REMOTE_PEERS),
) -> dict[str, tuple[CosinePeer, RemotePeer]]:
    """sentence-transformers' ONNX and OpenVINO backends in the environment of `python`, by
    bench path name, each with its worker (to close). The OpenVINO one calibrates on the
    engine's generic calibration text, split into sentences (never evaluation data)."""
    from engine.pipeline.text import split_sentences
    from export.ov_int8 import CALIBRATION_QUESTIONS, CALIBRATION_TEXTS

    calibration = folder / "calibration" / "train.jsonl"
    calibration.parent.mkdir(parents=True, exist_ok=True)
    sentences = [t[a:b] for t in CALIBRATION_TEXTS for a, b in split_sentences(t)] + list(
        CALIBRATION_QUESTIONS
    )
    calibration.write_text("".join(json.dumps({"text": s}) + "\n" for s in sentences))
    peers = {}
    for backend in backends:
        log(f"peers: sentence-transformers {backend} backend in {python}: its own export and int8 ...")
        remote = RemotePeer(
            python,
            checkpoint,
            backend,
            folder / f"st-{backend}",
            int8_config(),
            calibration if backend == "openvino" else None,
        )
        log(f"peers: sentence-transformers {backend}: {remote.model}")
        peers[REMOTE_PEERS[backend]] = (CosinePeer(remote.embed, lambda texts: [], None, "int8"), remote)
    return peers


def embedding_peers(
    checkpoint: str,
    folder: Path,
    device: str = "cpu",
    threads: int | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, CosinePeer]:
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
        from export.backbone import plain_backbone, plain_backbone_int8

        plain_backbone(checkpoint, plain)
        plain_backbone_int8(plain, folder / "int8")
        pooling = _pooling(Path(checkpoint)) if Path(checkpoint).is_dir() else "mean"
        peers["peer: fastembed (ONNX Runtime fp32, plain export; embed + cosine, no decisions)"] = (
            fastembed_peer(plain, pooling, threads)
        )
        peers[
            "peer: fastembed (ONNX Runtime int8 dynamic, per-tensor weights; embed + cosine, no decisions)"
        ] = fastembed_peer(folder / "int8", pooling, threads, precision="int8")
    st = sentence_transformers_peer(checkpoint, device, plain / "model.onnx" if fastembed_ok else None)
    if st is None:
        log(
            "peer sentence-transformers: not installed (pip install 'prune-engine[default-model]'): not measured"
        )
    else:
        peers["peer: sentence-transformers (torch fp32; encode + cosine, no decisions)"] = st
    return peers
