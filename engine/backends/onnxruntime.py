"""ONNX Runtime in-process: the embedded default."""

from __future__ import annotations

import contextlib
import ctypes
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.backends.base import Backend, TokenCore
from engine.pipeline.encode import ModelBatch
from engine.errors import BackendError, ModelLoadError
from engine.settings import DEFAULTS, checked


#: What ONNX Runtime's CPU arena does after a run: engine.settings' ort_arena (shrink, keep, off).
#: "shrink" gives the memory a large batch took back to the system after it; "off" (no arena)
#: returns memory too but makes large batches slower (docs/decisions.md, memory).
#: "shrink" shrinks the arena after a batch of more than this many padded tokens only:
#: smaller batches keep the arena they grew (401 MB after an 8 x 512 batch of the default
#: INT8 model), for shrinking after each of them cost a fifth of the RAG workload's speed
#: (docs/limits.md; docs/decisions.md, memory).
SHRINK_ABOVE_TOKENS = 4096


#: What ONNX Runtime does with denormal floats: engine.settings' ort_denormals, flush
#: (flush-to-zero and denormals-are-zero while it runs) or keep (IEEE, ORT's default). The
#: attention's softmax over masked positions makes denormals, and on Intel CPUs each costs a
#: microcode assist (docs/performance.md has the figures).
_FTZ_DAZ = 0x8040  # MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6)


def _libm() -> Any:
    """glibc's libm on x86-64 Linux (its fenv_t holds MXCSR at byte 28), else None."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return None
    try:
        return ctypes.CDLL("libm.so.6")
    except OSError:
        return None


_LIBM = _libm()


@contextlib.contextmanager
def thread_denormals(flush: bool):
    """The calling thread's floating-point state as ONNX Runtime should run, and as it
    was afterwards. ORT's calling thread runs its share of every parallel loop, but ORT sets
    flush-to-zero only on its own pool threads and, once per process, on the thread that
    makes the first session (`std::call_once`): so a run flushes the calling thread here
    and a session's making is undone, and the caller's Python and numpy keep IEEE
    denormals (hypothesis, for one, refuses to run without them)."""
    saved = (ctypes.c_uint32 * 8)()
    if _LIBM is None or _LIBM.fegetenv(saved) != 0:
        yield
        return
    if flush:
        env = (ctypes.c_uint32 * 8)(*saved)
        env[7] |= _FTZ_DAZ
        _LIBM.fesetenv(env)
    try:
        yield
    finally:
        _LIBM.fesetenv(saved)


def denormal_state(flush: bool) -> str:
    """Whether the flush of denormal floats is in force here, in words (what describe() says):
    it takes x86-64 (ONNX Runtime sets its own threads' MXCSR) and, for the calling thread's
    share of each run, Linux's glibc or musl; elsewhere it is partial or nothing."""
    if not flush:
        return "IEEE denormals"
    if _LIBM is not None:
        return "denormals flushed"
    if platform.machine().lower() in ("x86_64", "amd64"):
        return "denormals flushed on ONNX Runtime's threads only (the calling thread's needs Linux)"
    return "denormal flush not in force (x86-64 only)"


def arena_mode(value: str = DEFAULTS.ort_arena) -> str:
    """The arena mode `value`, checked (PRUNE_ORT_ARENA is read where a process starts:
    engine.models.loading.LoadOptions.from_env)."""
    return checked("ort_arena", value.strip().lower(), ModelLoadError, "the ONNX Runtime arena")


DEVICES = ("cpu", "cuda")


TENSORRT_FALLBACK = (
    "ONNX Runtime's TensorRT provider is not available here (it needs TensorRT's libraries): "
    "running the CUDA provider"
)


#: The libraries ONNX Runtime's CUDA provider opens when it loads (CUDA 12 and 13 builds);
#: pip installs them under `nvidia/*/lib` (nvidia-cu13 / nvidia-cudnn-cu13 and the like).
CUDA_LIBRARIES = (
    "libcudart.so",
    "libcublasLt.so",
    "libcublas.so",
    "libcufft.so",
    "libcurand.so",
    "libnvrtc.so",
    "libcudnn.so",
)


def preload_cuda_libraries(ort: Any) -> list[str]:
    """Load the pip-installed CUDA libraries before a CUDA session; returns those of
    CUDA_LIBRARIES this process still lacks (Linux; [] elsewhere).

    ONNX Runtime's own `preload_dlls()` looks for the `nvidia` packages beside onnxruntime,
    which misses them when onnxruntime-gpu was installed elsewhere (`pip install --target`,
    a PYTHONPATH folder ahead of site-packages): every `nvidia/*/lib` folder on sys.path is
    searched too, in dependency order."""
    import contextlib
    import ctypes
    import io
    import sys

    if not sys.platform.startswith("linux"):
        return []
    if hasattr(ort, "preload_dlls"):
        with contextlib.suppress(Exception), contextlib.redirect_stdout(io.StringIO()):
            ort.preload_dlls()  # it prints what it could not load; we say it below
    lib_dirs = [
        d
        for entry in sys.path
        if entry and (Path(entry) / "nvidia").is_dir()
        for d in sorted((Path(entry) / "nvidia").glob("*/lib"))
    ]
    for name in CUDA_LIBRARIES:
        if name in loaded_libraries():
            continue
        for d in lib_dirs:
            for f in sorted(d.glob(name + ".*")):
                with contextlib.suppress(OSError):
                    ctypes.CDLL(str(f), mode=ctypes.RTLD_GLOBAL)
    loaded = loaded_libraries()
    return [n for n in CUDA_LIBRARIES if n not in loaded]


def loaded_libraries() -> str:
    """The file names of the shared libraries this process has mapped (Linux)."""
    try:
        return " ".join(
            line.rsplit("/", 1)[-1]
            for line in Path("/proc/self/maps").read_text().splitlines()
            if "/" in line
        )
    except OSError:
        return ""


def require_cuda() -> None:
    """Raise a ModelLoadError naming the fix when ONNX Runtime has no CUDA provider."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ModelLoadError("onnxruntime is not installed: pip install 'prune-engine[gpu]'") from exc
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise ModelLoadError(
            "device='cuda' needs ONNX Runtime's CUDA provider: pip install "
            "'prune-engine[gpu]' (onnxruntime-gpu, without the CPU onnxruntime); "
            f"this onnxruntime {ort.__version__} has {available}"
        )


class ArenaRuns:
    """The RunOptions of one run, by its size: with the arena mode "shrink", a run of more
    than SHRINK_ABOVE_TOKENS padded tokens gives back the memory it took; other runs (and
    every run in the modes "keep" and "off") use plain RunOptions."""

    def __init__(self, ort: Any, mode: str):
        self.plain = ort.RunOptions()
        self.shrink = None
        if mode == "shrink":
            self.shrink = ort.RunOptions()
            self.shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def __call__(self, tokens: int) -> Any:
        """The run options for a batch of `tokens` tokens (the arena shrunk after a large one)."""
        return self.shrink if self.shrink is not None and tokens > SHRINK_ABOVE_TOKENS else self.plain


def session_options(
    ort: Any,
    intra_op_threads: int | None = None,
    inter_op_threads: int | None = None,
    arena: str = DEFAULTS.ort_arena,
    denormals: str = DEFAULTS.ort_denormals,
) -> tuple[Any, ArenaRuns]:
    """(SessionOptions, ArenaRuns) as every engine session uses them: all graph
    optimizations, threads (None: every core), the arena mode, denormals flushed to zero
    or kept (`DENORMALS`)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if intra_op_threads:
        opts.intra_op_num_threads = int(intra_op_threads)
    if inter_op_threads:
        opts.inter_op_num_threads = int(inter_op_threads)
    opts.log_severity_level = 3
    checked("ort_denormals", denormals, ModelLoadError, "denormals")
    opts.add_session_config_entry("session.set_denormal_as_zero", "1" if denormals == "flush" else "0")
    mode = arena_mode(arena)
    if mode == "off":
        opts.enable_cpu_mem_arena = False
    return opts, ArenaRuns(ort, mode)


def tensorrt_options(
    input_names: list[str], buckets: list[int], max_batch: int, cache: str | Path
) -> dict[str, Any]:
    """ONNX Runtime's TensorRT provider: fp16, an engine cache, and one optimization
    profile spanning the engine's length buckets (min: 1 x the smallest bucket; opt: 8 x
    the middle bucket; max: max_batch x the window)."""

    def shapes(rows: int, length: int) -> str:
        return ",".join(f"{n}:{rows}x{length}" for n in input_names)

    mid = buckets[len(buckets) // 2]
    return {
        "trt_fp16_enable": True,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache),
        "trt_timing_cache_enable": True,
        "trt_profile_min_shapes": shapes(1, buckets[0]),
        "trt_profile_opt_shapes": shapes(min(8, max_batch), mid),
        "trt_profile_max_shapes": shapes(max_batch, buckets[-1]),
    }


def session_providers(
    ort: Any, device: str, providers: list[Any] | None, tensorrt: dict[str, Any] | None, say: Any
) -> list[Any]:
    """The providers a session is made with: the CPU's for device "cpu" (even where
    onnxruntime-gpu offers CUDA first) unless `providers` are given; CUDA's (TensorRT's
    first when asked for and present, else saying so) for "cuda"."""
    if device != "cuda":
        return ["CPUExecutionProvider"] if providers is None else providers
    # use_tf32 0: ONNX Runtime's CUDA provider runs fp32 MatMuls in TF32 by default and
    # PyTorch does not, so fp32 rows would compare unlike things (fp16 graphs are unaffected)
    chosen: list[Any] = [("CUDAExecutionProvider", {"device_id": 0, "use_tf32": 0}), "CPUExecutionProvider"]
    if tensorrt is not None:
        if "TensorrtExecutionProvider" in ort.get_available_providers():
            chosen.insert(0, ("TensorrtExecutionProvider", tensorrt))
        else:
            say(TENSORRT_FALLBACK)
    return chosen


def check_cuda_ran(ran: str, providers: list[str], missing: list[str]) -> None:
    """ModelLoadError when a device="cuda" session fell back to the CPU (onnxruntime-gpu
    does when CUDA's libraries do not load), naming what is missing."""
    if ran in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
        return
    raise ModelLoadError(
        f"device='cuda': ONNX Runtime's CUDA provider did not load and the session fell back to {providers}; "
        + (f"not found or not loadable: {', '.join(missing)} (" if missing else "(")
        + "pip install 'onnxruntime-gpu[cuda,cudnn]' brings them as pip packages, found on sys.path; "
        "or put CUDA's and cuDNN's lib folders on LD_LIBRARY_PATH)"
    )


@dataclass
class OrtSession:
    """An ONNX Runtime session as `ort_session` makes every one of the engine's: the session, the
    run options of a batch by its size (`runs`), whether denormals are flushed, and whether a
    TensorRT provider asked for fell back to CUDA."""

    session: Any
    runs: ArenaRuns
    arena: str
    flush: bool
    tensorrt_fallback: bool = False


def ort_session(
    graph: Path,
    *,
    intra_op_threads: int | None = None,
    inter_op_threads: int | None = None,
    providers: list[Any] | None = None,
    arena: str = DEFAULTS.ort_arena,
    denormals: str = DEFAULTS.ort_denormals,
    device: str = "cpu",
    tensorrt: dict[str, Any] | None = None,
    log: Any = None,
) -> OrtSession:
    """The one way the engine makes an ONNX Runtime session of `graph` (a pruner's core, a
    compressor's, the retrieval embedder): the options (`session_options`), the providers for
    `device` ("cuda": ONNX Runtime's CUDA provider, falling back to the CPU an error; `tensorrt`:
    its TensorRT provider first), this thread's floating-point state kept, and a ModelLoadError
    naming the graph for what cannot load."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ModelLoadError(
            "onnxruntime is not installed: pip install 'prune-engine[cpu]' (or [gpu] for onnxruntime-gpu)"
        ) from exc
    if not graph.is_file():
        raise ModelLoadError(f"{graph}: no ONNX graph")
    if device not in DEVICES:
        raise ModelLoadError(f"device must be one of {DEVICES}, got {device!r}")
    if tensorrt is not None and device != "cuda":
        raise ModelLoadError("ONNX Runtime's TensorRT provider needs device='cuda' (--device cuda)")
    mode = arena_mode(arena)
    opts, runs = session_options(ort, intra_op_threads, inter_op_threads, mode, denormals)
    say = log or (lambda m: None)
    missing: list[str] = []
    if device == "cuda":
        require_cuda()
        missing = preload_cuda_libraries(ort)
    try:
        with thread_denormals(False):  # ORT's first session sets this thread's flags: undone
            session = ort.InferenceSession(
                str(graph),
                sess_options=opts,
                providers=session_providers(ort, device, providers, tensorrt, say),
            )
    except Exception as exc:
        raise ModelLoadError(
            f"{graph}: ONNX Runtime cannot load the graph ({type(exc).__name__}: {exc})"
        ) from exc
    ran = session.get_providers()[0]
    if device == "cuda":
        check_cuda_ran(ran, session.get_providers(), missing)
    # the TensorRT provider was asked for but is not what runs (its libraries did not load and ONNX
    # Runtime quietly fell back to CUDA): a "tensorrt" figure would be CUDA's
    fallback = tensorrt is not None and ran != "TensorrtExecutionProvider"
    if fallback and "TensorrtExecutionProvider" in ort.get_available_providers():
        say(TENSORRT_FALLBACK)
    return OrtSession(session, runs, mode, denormals == "flush", fallback)


class OnnxRuntimeBackend(Backend):
    """A pruner's core on ONNX Runtime (its session: `ort_session`). `device="cuda"` runs ONNX
    Runtime's CUDA provider (onnxruntime-gpu) with IO binding: the inputs are copied to the GPU
    once per batch, and only the small pooled outputs (B floats and B x S probabilities) come
    back. `tensorrt` puts ONNX Runtime's TensorRT provider first (`tensorrt_options`), where the
    installed onnxruntime-gpu has it."""

    name = "onnxruntime"

    def __init__(
        self,
        graph: str | Path,
        *,
        intra_op_threads: int | None = None,
        inter_op_threads: int | None = None,
        providers: list[Any] | None = None,
        arena: str = DEFAULTS.ort_arena,
        device: str = "cpu",
        io_binding: bool | None = None,
        tensorrt: dict[str, Any] | None = None,
        log: Any = None,
        denormals: str = DEFAULTS.ort_denormals,
    ):
        graph = Path(graph)
        made = ort_session(
            graph,
            intra_op_threads=intra_op_threads,
            inter_op_threads=inter_op_threads,
            providers=providers,
            arena=arena,
            denormals=denormals,
            device=device,
            tensorrt=tensorrt,
            log=log,
        )
        self.session, self.runs, self.arena, self.flush = made.session, made.runs, made.arena, made.flush
        #: the TensorRT provider was asked for but is not what runs (OrtSession.tensorrt_fallback)
        self.tensorrt_fallback = made.tensorrt_fallback
        self.device = device
        self.io_binding = (device == "cuda") if io_binding is None else bool(io_binding)
        self.input_names = [i.name for i in self.session.get_inputs()]
        outputs = [o.name for o in self.session.get_outputs()]
        if outputs[:2] != ["rerank_score", "sentence_probs"]:
            raise ModelLoadError(
                f"{graph}: outputs {outputs} do not follow the contract (rerank_score, sentence_probs)"
            )
        self.graph = graph

    def infer(self, batch: ModelBatch) -> tuple[np.ndarray, np.ndarray]:
        """(rerank_score [B], sentence_probs [B, S]) of one padded batch."""
        try:
            with thread_denormals(self.flush):
                return self._run(batch)
        except Exception as exc:
            raise BackendError(f"ONNX Runtime failed on a batch of shape {batch.shape}: {exc}") from exc

    def _run(self, batch: ModelBatch) -> tuple[np.ndarray, np.ndarray]:
        runs = self.runs(int(np.prod(batch.shape)))
        if not self.io_binding:
            rerank, probs = self.session.run(
                ["rerank_score", "sentence_probs"], batch.inputs(self.input_names), runs
            )
            return rerank, probs
        binding = self.session.io_binding()
        for name, array in batch.inputs(self.input_names).items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in ("rerank_score", "sentence_probs"):
            binding.bind_output(name, "cpu")  # small: B and B x S floats
        self.session.run_with_iobinding(binding, runs)
        rerank, probs = binding.copy_outputs_to_cpu()[:2]
        return rerank, probs

    def describe(self) -> str:
        """The execution provider and graph, in words."""
        return (
            f"onnxruntime {self.session.get_providers()[0]} ({self.graph.name}"
            + (", IO binding" if self.io_binding else "")
            + ("" if self.device == "cuda" else f"; {denormal_state(self.flush)}")
            + ")"
        )


class OrtTokenProbs(TokenCore):
    """A compressor's core on ONNX Runtime (its session: `ort_session`, as a pruner's): an
    LLMLingua-2 export's probability of label 1 per token, the graph's `token_probs`; `device`
    "cuda": ONNX Runtime's CUDA provider, which falling back to the CPU is an error (`tensorrt`:
    its TensorRT provider first)."""

    name = "onnxruntime"

    def __init__(
        self,
        graph: str | Path,
        *,
        intra_op_threads: int | None = None,
        providers: list[Any] | None = None,
        arena: str = DEFAULTS.ort_arena,
        denormals: str = DEFAULTS.ort_denormals,
        device: str = "cpu",
        tensorrt: dict[str, Any] | None = None,
    ):
        self.graph = Path(graph)
        made = ort_session(
            self.graph,
            intra_op_threads=intra_op_threads,
            providers=providers,
            arena=arena,
            denormals=denormals,
            device=device,
            tensorrt=tensorrt,
        )
        self.session, self.runs, self.flush = made.session, made.runs, made.flush
        self.provider = self.session.get_providers()[0]
        #: chunks per run: one at a time on the CPU (no padding; engine.compressor.BATCH_CHUNKS says
        #: why), else None: the Compressor's batches
        self.batch_chunks = 1 if self.provider == "CPUExecutionProvider" else None
        inputs = [i.name for i in self.session.get_inputs()]
        outputs = [o.name for o in self.session.get_outputs()]
        if inputs != ["input_ids", "attention_mask"] or outputs != ["token_probs"]:
            raise ModelLoadError(
                f"{self.graph}: inputs {inputs} and outputs {outputs} are not an LLMLingua-2 export's "
                "(input_ids, attention_mask -> token_probs)"
            )

    def token_probs(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The graph's token_probs (float32, [B, L]) of one padded batch."""
        feed = {"input_ids": input_ids, "attention_mask": attention_mask}
        try:
            with thread_denormals(self.flush):
                return self.session.run(["token_probs"], feed, self.runs(int(input_ids.size)))[0]
        except Exception as exc:
            raise BackendError(f"ONNX Runtime failed on a batch of shape {input_ids.shape}: {exc}") from exc

    def describe(self) -> str:
        """The provider and graph, in words."""
        return f"onnxruntime {self.provider} ({self.graph.name}; {denormal_state(self.flush)})"
