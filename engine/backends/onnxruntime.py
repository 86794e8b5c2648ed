"""ONNX Runtime in-process: the embedded default."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from engine.backends.base import Backend
from engine.batching import ModelBatch
from engine.errors import BackendError, ModelLoadError


#: What ONNX Runtime's CPU arena does after a run (env PRUNE_ORT_ARENA): "shrink" (default:
#: memory a large batch took goes back to the system after it; 1,268 -> 148 MB RSS after a
#: 32 x 512 batch of the default INT8 model, +3% time on that batch), "keep" (ORT's default:
#: the arena keeps its peak), "off" (no arena: memory returns too, but a 32 x 512 batch
#: takes twice as long). benchmarks/results/memory/ has the measurement.
ARENA_MODES = ("shrink", "keep", "off")


def arena_mode(value: str | None = None) -> str:
    mode = (value or os.environ.get("PRUNE_ORT_ARENA") or "shrink").strip().lower()
    if mode not in ARENA_MODES:
        raise ModelLoadError(f"PRUNE_ORT_ARENA must be one of {ARENA_MODES}, got {mode!r}")
    return mode


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def __init__(self, graph: str | Path, *, intra_op_threads: int | None = None,
                 inter_op_threads: int | None = None, providers: list[str] | None = None,
                 arena: str | None = None):
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise ModelLoadError("onnxruntime is not installed: pip install 'prune-engine[cpu]' "
                                 "(or [gpu] for onnxruntime-gpu)") from exc
        graph = Path(graph)
        if not graph.is_file():
            raise ModelLoadError(f"{graph}: no ONNX graph")
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        env_threads = os.environ.get("PRUNE_INTRA_OP_THREADS")
        if intra_op_threads is None and env_threads:
            intra_op_threads = int(env_threads)
        if intra_op_threads:
            opts.intra_op_num_threads = int(intra_op_threads)
        if inter_op_threads:
            opts.inter_op_num_threads = int(inter_op_threads)
        opts.log_severity_level = 3
        self.arena = arena_mode(arena)
        if self.arena == "off":
            opts.enable_cpu_mem_arena = False
        self.run_options = ort.RunOptions()
        if self.arena == "shrink":
            self.run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        available = ort.get_available_providers()
        if providers is None:
            providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
        try:
            self.session = ort.InferenceSession(str(graph), sess_options=opts, providers=providers)
        except Exception as exc:
            raise ModelLoadError(f"{graph}: ONNX Runtime cannot load the graph "
                                 f"({type(exc).__name__}: {exc})") from exc
        self.input_names = [i.name for i in self.session.get_inputs()]
        outputs = [o.name for o in self.session.get_outputs()]
        if outputs[:2] != ["rerank_score", "sentence_probs"]:
            raise ModelLoadError(f"{graph}: outputs {outputs} do not follow the contract "
                                 "(rerank_score, sentence_probs)")
        self.graph = graph

    def infer(self, batch: ModelBatch) -> tuple[np.ndarray, np.ndarray]:
        try:
            rerank, probs = self.session.run(["rerank_score", "sentence_probs"],
                                             batch.inputs(self.input_names), self.run_options)
        except Exception as exc:
            raise BackendError(f"ONNX Runtime failed on a batch of shape {batch.shape}: {exc}") from exc
        return rerank, probs

    def describe(self) -> str:
        return f"onnxruntime {self.session.get_providers()[0]} ({self.graph.name})"
