"""GPU throughput of a Provence-size model (DeBERTa-v3-large configuration, random
weights: speed does not depend on them) through the engine's PyTorch module.

    python -m benchmarks.gpu --out results.json            # on a GPU machine (benchmarks/gpu.sh)
    python -m benchmarks.gpu --tiny --device cpu --out x.json   # a dry run of the script on CPU

For lengths 128/256/512 and batch sizes 1-256 it times fp32, fp16 and bf16 eager
forwards (and SDPA attention) of the full contract module (encoder, heads, float32
softmax and sentence pooling), with CUDA events after warm-up, and reports sequences/s
and the share of the GPU's dense fp16 peak, counting the model's FLOPs:

    per sequence of L tokens, per layer: 2 x 12 h^2 L (projections and FFN, 4h intermediate)
    + 2 x 2 x L^2 h (QK^T and AV) + 2 x 2 x L^2 h (DeBERTa's c2p and p2c terms)
    + 2 x 2 x L x 2k x h (position key/query projections over 2k relative positions, k = 256)

Needs only torch and transformers (no TensorRT, no onnxruntime-gpu).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096,
         "vocab_size": 128100, "max_position_embeddings": 512, "relative_attention": True,
         "pos_att_type": ["p2c", "c2p"], "position_buckets": 256, "norm_rel_ebd": "layer_norm",
         "share_att_key": True, "position_biased_input": False, "type_vocab_size": 0,
         "max_relative_positions": -1, "pooler_hidden_size": 1024, "pooler_hidden_act": "gelu",
         "hidden_act": "gelu", "layer_norm_eps": 1e-7, "num_labels": 1}
TINY = {**LARGE, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
        "vocab_size": 1000, "pooler_hidden_size": 64}


def flops_per_sequence(cfg: dict, length: int) -> float:
    h, n = cfg["hidden_size"], cfg["num_hidden_layers"]
    k = cfg.get("position_buckets", 256)
    per_layer = (2 * 12 * h * h * length + 2 * 2 * length * length * h + 2 * 2 * length * length * h
                 + 2 * 2 * length * 2 * k * h)
    return n * per_layer + 2 * h * 2 * length  # + token head


def main(argv=None) -> int:
    import torch
    from transformers import AutoConfig

    from engine.families import FAMILIES
    from engine.modeling import ProvenceModel

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny configuration (dry run on CPU)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float16", "bfloat16"])
    ap.add_argument("--attn", nargs="+", default=["eager", "sdpa"])
    ap.add_argument("--peak-tflops", type=float, default=990.0, help="dense fp16 peak (H200: ~990)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting new cases after this")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    cfg_dict = TINY if args.tiny else LARGE
    dev = torch.device(args.device)
    rows = []
    start = time.time()
    info = {"torch": torch.__version__, "device": args.device, "python": platform.python_version(),
            "config": "tiny" if args.tiny else "deberta-v3-large (Provence)"}
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    for attn in args.attn:
        cfg = AutoConfig.for_model("deberta-v2", **cfg_dict)
        cfg._attn_implementation = attn
        try:
            base = ProvenceModel(cfg).eval()
        except Exception as exc:  # an attention implementation DeBERTa lacks
            rows.append({"attn": attn, "error": str(exc)[:200]})
            continue
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            model = base.to(dev, dtype)
            for length in args.lengths:
                for bs in args.batches:
                    if time.time() - start > args.budget_s:
                        break
                    ids = torch.randint(5, cfg.vocab_size, (bs, length), device=dev)
                    mask = torch.ones_like(ids)
                    sid = torch.arange(length, device=dev).div(32, rounding_mode="floor").expand(bs, length).contiguous()
                    try:
                        with torch.inference_mode():
                            for _ in range(2):
                                model(ids, mask, sid)
                            if dev.type == "cuda":
                                torch.cuda.synchronize()
                                t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                                t0.record()
                                for _ in range(args.iters):
                                    r, p = model(ids, mask, sid)
                                t1.record()
                                torch.cuda.synchronize()
                                sec = t0.elapsed_time(t1) / 1000 / args.iters
                            else:
                                t = time.perf_counter()
                                for _ in range(args.iters):
                                    r, p = model(ids, mask, sid)
                                sec = (time.perf_counter() - t) / args.iters
                        finite = bool(torch.isfinite(p).all() and torch.isfinite(r).all())
                    except torch.cuda.OutOfMemoryError if dev.type == "cuda" else MemoryError:
                        rows.append({"attn": attn, "dtype": dtype_name, "length": length, "batch": bs, "error": "OOM"})
                        if dev.type == "cuda":
                            torch.cuda.empty_cache()
                        continue
                    seq_s = bs / sec
                    tflops = flops_per_sequence(cfg_dict, length) * seq_s / 1e12
                    row = {"attn": attn, "dtype": dtype_name, "length": length, "batch": bs,
                           "ms_per_batch": sec * 1000, "sequences_per_s": seq_s, "tflops": tflops,
                           "share_of_fp16_peak": tflops / args.peak_tflops, "finite": finite}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            del model
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    with open(args.out, "w") as fh:
        json.dump({"info": info, "rows": rows, "command": " ".join(sys.argv)}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
