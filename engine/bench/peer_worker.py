"""A `prune bench` peer that runs in another Python environment: sentence-transformers with
its ONNX backend (its own dynamic INT8 export, through optimum) or its OpenVINO backend (its
own static INT8 export, through optimum-intel and NNCF). Those backends need optimum, which
pins transformers below 4.58, so they cannot live beside the engine; `prune bench
--peer-python PYTHON` runs this file with that environment's interpreter
(engine/bench/peers.py: `remote_peer`). It imports nothing of the engine.

Start: `PYTHON peer_worker.py --checkpoint CK --backend onnx|openvino|torch --work DIR
[--int8-config avx2|avx512|avx512_vnni] [--calibration FILE]`: the checkpoint is exported and
quantized into DIR as sentence-transformers' documentation does it, loaded, and one JSON line
`{"ready": ..., "model": ...}` is printed. Then each line on stdin is `{"texts": [...]}` and
the answer one line `{"n": N, "dim": D, "emb": base64 of float32 [N, D]}` (L2-normalised,
`encode` in batches of 64, as the engine's other peers). `torch` (no export) checks the
protocol against the in-process peer.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from pathlib import Path

# run as a script, its own folder comes first on sys.path, where engine/datafiles.py
# would shadow Hugging Face's `datasets`
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

BATCH = 64


def load(args):
    """The model as its documentation exports and loads it, and what runs, in words."""
    from sentence_transformers import SentenceTransformer

    work = Path(args.work)
    if args.backend == "torch":
        return SentenceTransformer(args.checkpoint, device="cpu"), "torch fp32"
    if args.backend == "onnx":
        from sentence_transformers import export_dynamic_quantized_onnx_model

        model = SentenceTransformer(args.checkpoint, backend="onnx")
        model.save_pretrained(str(work))  # the quantized file goes beside the model, as on the hub
        export_dynamic_quantized_onnx_model(model, args.int8_config, str(work))
        (graph,) = sorted((work / "onnx").glob(f"model_*{args.int8_config}.onnx"))
        file_name = f"onnx/{graph.name}"
    else:
        from optimum.intel import OVQuantizationConfig
        from sentence_transformers import export_static_quantized_openvino_model

        calibration = Path(args.calibration)
        samples = sum(1 for line in calibration.read_text().splitlines() if line.strip())
        model = SentenceTransformer(args.checkpoint, backend="openvino")
        model.save_pretrained(str(work))
        export_static_quantized_openvino_model(
            model,
            OVQuantizationConfig(num_samples=samples),
            str(work),
            dataset_name=str(calibration.parent),
            dataset_config_name="default",
            dataset_split=calibration.stem,
            column_name="text",
        )
        (graph,) = sorted((work / "openvino").glob("openvino_model_*quantized.xml"))
        file_name = f"openvino/{graph.name}"
    model = SentenceTransformer(str(work), backend=args.backend, model_kwargs={"file_name": file_name})
    return model, f"{args.backend} {file_name}"


def main(argv=None) -> int:
    """Serve embeddings on stdin/stdout, one JSON line each way."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--backend", choices=["onnx", "openvino", "torch"], required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--int8-config", default="avx2", choices=["arm64", "avx2", "avx512", "avx512_vnni"])
    p.add_argument("--calibration", help='openvino: a JSONL file of {"text": ...} to calibrate on')
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = sys.stdout
    sys.stdout = sys.stderr  # the libraries' prints must not reach the protocol
    model, what = load(args)
    import numpy as np

    out.write(json.dumps({"ready": True, "model": what}) + "\n")
    out.flush()
    for line in sys.stdin:
        texts = json.loads(line)["texts"]
        emb = np.asarray(
            model.encode(
                texts,
                batch_size=BATCH,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            ),
            dtype=np.float32,
        )
        out.write(
            json.dumps(
                {"n": emb.shape[0], "dim": emb.shape[1], "emb": base64.b64encode(emb.tobytes()).decode()}
            )
            + "\n"
        )
        out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
