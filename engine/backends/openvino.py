"""OpenVINO in-process (the `[openvino]` extra): the same exported ONNX graphs, or an
OpenVINO IR the export made with NNCF, on OpenVINO's CPU plugin.

Precisions (`precision`):
- "fp32": f32 inference of the fp32 graph;
- "bf16": the fp32 graph with bf16 inference (OpenVINO's inference-precision hint), where
  the CPU computes in bf16 natively (AVX512_BF16 or AMX-BF16); elsewhere a clear error,
  for OpenVINO would quietly emulate it at a fraction of the speed;
- an IR export's own precision (its manifest's, e.g. "int8-static"): whatever its graph
  holds, with f32 for the rest.

Threads: `threads` (INFERENCE_NUM_THREADS; None: all cores), one stream (a call's batches
run one after another, as with ONNX Runtime). Memory: OpenVINO caches what it compiled for
each input shape it saw (CPU_RUNTIME_CACHE_CAPACITY entries; `shape_cache`, default 5000:
OpenVINO's), which is its counterpart of ONNX Runtime's arena: 0 keeps nothing, so memory
stays flat and every shape is prepared again.

One InferRequest per thread: a Pruner shared by a service's threads runs them side by side.
"""

from __future__ import annotations

import functools

import threading
from pathlib import Path
from typing import Any

import numpy as np

from engine.backends.base import Backend, TokenCore
from engine.pipeline.encode import ModelBatch
from engine.machine.cpu import BF16_FLAGS, cpu_flags
from engine.errors import BackendError, ModelLoadError
from engine.pipeline.spec import GRAPH_OUTPUTS, RUNTIMES

PRECISIONS = RUNTIMES["openvino"]


@functools.cache
def openvino_instance():
    """The process's one `openvino.Core` (or a clear error naming the extra), kept until the
    process ends, as OpenVINO recommends (one Core per application). Not one per model: the
    CPU plugin gives a thread that compiles a model an alternate signal stack of each Core's
    own and puts the previous one back when that Core goes, so Cores dropped in the order
    they were made left the thread on a stack already unmapped, and the next signal with a
    Python handler there (SIGTERM to `prune api`) was a SIGSEGV
    (tests/inprocess/test_openvino.py). Each model's settings go with its compile_model."""
    try:
        import openvino as ov
    except ImportError as exc:
        raise ModelLoadError("OpenVINO is not installed: pip install 'prune-engine[openvino]'") from exc
    return ov.Core()


def bf16_supported(ov=None) -> bool:
    """Whether OpenVINO's CPU plugin computes bf16 natively here (`ov`: openvino_instance())."""
    ov = ov or openvino_instance()
    return "BF16" in ov.get_property("CPU", "OPTIMIZATION_CAPABILITIES")


class OvSession:
    """The one way the engine opens a graph on OpenVINO's CPU plugin (a pruner's core, a
    compressor's): an ONNX graph or OpenVINO IR (`graph`: .onnx or .xml) compiled at `precision`
    with `threads` and `shape_cache` (the module's doc), `outputs` the graph's first outputs, and
    an InferRequest per thread."""

    def __init__(
        self,
        graph: Path,
        *,
        precision: str = "fp32",
        threads: int | None = None,
        shape_cache: int | None = None,
        outputs: tuple[str, ...] = GRAPH_OUTPUTS,
    ):
        ov = openvino_instance()
        if not graph.is_file():
            raise ModelLoadError(f"{graph}: no graph")
        if precision not in PRECISIONS:
            raise ModelLoadError(
                f"OpenVINO inference precision must be one of {PRECISIONS}, got {precision!r}"
            )
        if precision == "bf16" and not bf16_supported(ov):
            raise ModelLoadError(_bf16_missing())
        if threads is not None and threads < 1:
            raise ModelLoadError(f"threads must be at least 1, got {threads}")
        if shape_cache is not None and shape_cache < 0:
            raise ModelLoadError(f"shape_cache must be 0 or more, got {shape_cache}")
        config: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32",
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": 1,
        }
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        if shape_cache is not None:
            config["CPU_RUNTIME_CACHE_CAPACITY"] = int(shape_cache)
        try:
            model = ov.read_model(str(graph))
            self.compiled = ov.compile_model(model, "CPU", config)
        except Exception as exc:
            raise ModelLoadError(
                f"{graph}: OpenVINO cannot load the graph ({type(exc).__name__}: {exc})"
            ) from exc
        names = [o.get_any_name() for o in self.compiled.outputs]
        if names[: len(outputs)] != list(outputs):
            raise ModelLoadError(
                f"{graph}: outputs {names} do not follow the contract ({', '.join(outputs)})"
            )
        self.input_names = [i.get_any_name() for i in self.compiled.inputs]
        self._outputs = tuple(self.compiled.output(name) for name in outputs)
        self._local = threading.local()
        self.graph, self.precision, self.threads = graph, precision, threads

    def run(self, feeds: dict[str, np.ndarray], shape: Any = None) -> tuple[np.ndarray, ...]:
        """The outputs (float32 copies) of one padded batch, on this thread's InferRequest."""
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        try:
            out = request.infer(feeds)
            return tuple(np.array(out[o], dtype=np.float32, copy=True) for o in self._outputs)
        except Exception as exc:
            raise BackendError(f"OpenVINO failed on a batch of shape {shape}: {exc}") from exc

    def describe(self) -> str:
        """The runtime, graph and inference precision, in words."""
        kind = "IR" if self.graph.suffix == ".xml" else "ONNX"
        return f"openvino CPU, {self.precision} inference, {kind} graph {self.graph.name}"


def _bf16_missing() -> str:
    """Why bf16 cannot run here, naming this CPU's flags."""
    flags = cpu_flags()
    have = sorted(f for f in flags or () if f.startswith(("avx512", "amx")))
    seen = (
        "its flags cannot be read here"
        if flags is None
        else f"this one has {', '.join(have) or 'no AVX-512 or AMX flags'}"
    )
    return (
        f"bf16 needs a CPU that computes in bf16 ({' or '.join(BF16_FLAGS)}) and OpenVINO's CPU plugin "
        f"says this one does not ({seen}): use fp32, or the static INT8 export"
    )


class OpenVinoBackend(Backend):
    """A pruner's core on OpenVINO's CPU plugin (its graph opened by OvSession)."""

    name = "openvino"

    def __init__(
        self,
        graph: str | Path,
        *,
        precision: str = "fp32",
        threads: int | None = None,
        shape_cache: int | None = None,
    ):
        self.session = OvSession(Path(graph), precision=precision, threads=threads, shape_cache=shape_cache)
        self.input_names = self.session.input_names
        self.graph, self.precision, self.threads = self.session.graph, precision, threads

    def infer(self, batch: ModelBatch) -> tuple[np.ndarray, np.ndarray]:
        """(rerank_score [B], sentence_probs [B, S]) of one padded batch."""
        rerank, probs = self.session.run(batch.inputs(self.input_names), batch.shape)
        return rerank, probs

    def describe(self) -> str:
        """The runtime, graph and inference precision, in words."""
        return self.session.describe()


class OvTokenProbs(TokenCore):
    """A compressor's core on OpenVINO's CPU plugin (its graph opened by OvSession, as a pruner's):
    an LLMLingua-2 export's graph at the precision its manifest's `runtime` asks for (bf16 inference
    where the CPU computes bf16), `token_probs` as OrtTokenProbs's; each chunk alone, as on ONNX
    Runtime's CPU provider (engine.compressor.BATCH_CHUNKS says why)."""

    name = "openvino"
    batch_chunks = 1

    def __init__(
        self,
        graph: str | Path,
        *,
        precision: str = "fp32",
        threads: int | None = None,
        shape_cache: int | None = None,
    ):
        self.session = OvSession(
            Path(graph),
            precision=precision,
            threads=threads,
            shape_cache=shape_cache,
            outputs=("token_probs",),
        )

    def token_probs(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The graph's token_probs (float32, [B, L]) of one padded batch."""
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        (probs,) = self.session.run(feeds, input_ids.shape)
        return probs

    def describe(self) -> str:
        """The runtime, graph and inference precision, in words."""
        return self.session.describe()
