"""What the client must know about a model: family, window, special tokens, inputs.

An exported model folder carries it in `manifest.json`, read and written only through
`Manifest`; a PyTorch checkpoint folder is described by reading its config and tokenizer.
The tokenizer an export names is loaded and checked against the model here too
(`manifest_tokenizer`). Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from engine.errors import ModelLoadError
from engine.pipeline.families import Family, get_family

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "prune-engine/1"
GRAPH_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "sentence_ids")
GRAPH_OUTPUTS = ("rerank_score", "sentence_probs")
#: an export's `kind`: absent (or "pruner") for the pruning families, "compressor" for LLMLingua-2's
#: token classifier, whose graph is another contract (COMPRESSOR_INPUTS -> COMPRESSOR_OUTPUT)
COMPRESSOR = "compressor"
COMPRESSOR_INPUTS = ("input_ids", "attention_mask")
COMPRESSOR_OUTPUT = "token_probs"  # float32 [B, L]: softmax over the two labels, label 1 (keep)


@dataclass(frozen=True)
class ModelSpec:
    """What the client needs of a model: its family (with the export's defaults), its
    window, its special tokens."""

    family: Family
    max_length: int
    cls_id: int
    sep_id: int
    pad_id: int
    name: str = "model"
    precision: str = "fp32"  # the export's (its manifest's), e.g. int8, int8-static
    auto_pick: bool = False  # chosen by `prune export --precision auto` on its machine

    @property
    def input_names(self) -> tuple[str, ...]:
        """The graph's inputs for this family (token_type_ids only where it uses them)."""
        return tuple(n for n in GRAPH_INPUTS if n != "token_type_ids" or self.family.uses_token_type_ids)

    def special_tokens(self) -> dict[str, int]:
        """cls_id, sep_id, pad_id."""
        return {"cls_id": self.cls_id, "sep_id": self.sep_id, "pad_id": self.pad_id}


def special_ids(tokenizer: Any) -> dict[str, int]:
    """cls/sep/pad ids of a transformers tokenizer (RoBERTa's <s>/</s> count as cls/sep)."""
    cls_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep_id = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id
    if cls_id is None or sep_id is None or pad_id is None:
        raise ModelLoadError(
            f"tokenizer {type(tokenizer).__name__} lacks a cls/sep/pad token "
            f"(cls={cls_id}, sep={sep_id}, pad={pad_id})"
        )
    return {"cls_id": int(cls_id), "sep_id": int(sep_id), "pad_id": int(pad_id)}


#: Bounds on a manifest's values (it may come from a server): a window past this, or a
#: bucket outside it, is refused before the client pads anything to it.
MAX_WINDOW = 32_768


# Ordinary English words that every real vocabulary of these families covers (with
# subwords at worst): a tokenizer that maps all of them to special tokens knows no words.
_PROBE_WORDS = ("the", "city", "water", "people", "history", "government", "river", "music")


def check_vocabulary(tok: Tokenizer, embedding_rows: int, family: Any, source: str) -> None:
    """Refuse a tokenizer that does not fit the model: a vocabulary far smaller than the
    word-embedding rows, or one that knows no ordinary word (every probe word becomes
    [UNK] or another special token). transformers 5 builds such a five-token tokenizer
    ([PAD] [UNK] [CLS] [SEP] [MASK]) without a word when a checkpoint ships no vocabulary;
    the model then runs on [UNK] alone and returns probabilities that mean nothing."""
    size = tok.get_vocab_size(with_added_tokens=True)
    specials = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    probe = tok.encode(" ".join(_PROBE_WORDS), add_special_tokens=False).ids
    problem = None
    if embedding_rows > 0 and size < embedding_rows // 2:
        problem = f"its vocabulary has {size} tokens for the model's {embedding_rows} word-embedding rows"
    elif not probe or all(i in specials for i in probe):
        names = sorted({tok.id_to_token(i) or str(i) for i in probe})
        problem = (
            f"it maps ordinary words ({', '.join(_PROBE_WORDS[:4])}, ...) to {', '.join(names) or 'nothing'} "
            f"(vocabulary of {size} tokens)"
        )
    if problem:
        usual = getattr(family, "usual_tokenizer", "") or "the checkpoint's own"
        raise ModelLoadError(
            f"{source}: the tokenizer does not fit the model: {problem}. The checkpoint probably "
            f"ships no tokenizer; export again with --tokenizer (a folder or hub id; for the "
            f"{getattr(family, 'name', 'model')} family usually {usual})"
        )


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The fast tokenizer from a `tokenizer.json`, with padding and truncation off."""
    path = Path(path)
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise ModelLoadError(f"{path}: cannot load tokenizer ({exc})") from exc
    tok.no_padding()
    tok.no_truncation()
    return tok


def manifest_tokenizer(folder: str | Path, manifest: Manifest, family: Family) -> Tokenizer:
    """An export folder's tokenizer (the file its `Manifest` names), checked
    against its model (check_vocabulary)."""
    tok = load_tokenizer(Path(folder) / manifest.tokenizer.file)
    check_vocabulary(tok, manifest.embedding_rows, family, str(folder))
    return tok


@dataclass(frozen=True)
class TokenizerInfo:
    """The manifest's `tokenizer`: its file in the folder and the special token ids."""

    cls_id: int
    sep_id: int
    pad_id: int
    file: str = "tokenizer.json"
    seps_between: int | None = None  # separators between question and context, when not the family's


@dataclass(frozen=True)
class Source:
    """Where an export came from (`source`)."""

    checkpoint: str
    weights_sha256: str | None = None
    num_attention_heads: int | None = None
    hidden_size: int | None = None


#: the runtimes an export may prefer (`runtime`), with the inference precisions each runs
#: its graph at (OpenVINO's bf16: the fp32 graph computed in bf16)
RUNTIMES = {"onnxruntime": ("fp32",), "openvino": ("fp32", "bf16")}


@dataclass(frozen=True)
class Runtime:
    """The runtime an export prefers (`runtime`), written by `prune export --precision auto`
    where its pick is a way of running the fp32 graph rather than another graph: loaders
    without a backend of their own choice use it."""

    backend: str
    precision: str = "fp32"

    def __str__(self) -> str:
        return f"{self.backend} {self.precision}"


@dataclass(frozen=True)
class Manifest:
    """An exported model folder's `manifest.json`, typed: the one place it is read and
    written (export writes it, every loader reads it, Triton ships it to clients). Keys the
    engine does not read (opset, versions, verification, ...) are kept in `data` and written
    back as they were. Manifests of earlier exports load: every key added since has a
    default (tests/inprocess/test_manifest.py)."""

    family: str
    max_length: int
    tokenizer: TokenizerInfo
    graph: str = "model.onnx"
    external_data: str | None = None  # the graph's weights file, when they are kept apart
    inputs: tuple[str, ...] = ()
    buckets: tuple[int, ...] = ()
    precision: str | None = None
    # the decision rules' defaults this export records over its family's (engine.pipeline.inputs:
    # the names of Rules.recorded; a name left out is the family's)
    defaults: dict[str, Any] = field(default_factory=dict)
    embedding_rows: int = 0  # input_ids must stay below this (0: unknown)
    source: Source | None = None
    options: dict[str, Any] = field(default_factory=dict)
    tensorrt: dict[str, Any] | None = None
    runtime: Runtime | None = None
    data: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ reading
    @classmethod
    def read(cls, folder: str | Path) -> Manifest:
        """The manifest of an exported folder; ModelLoadError saying what the folder is
        when it is not one, or what is wrong with its manifest."""
        folder = Path(folder)
        path = folder / MANIFEST
        if not folder.exists():
            raise ModelLoadError(f"{folder}: no such model folder")
        if not path.is_file():
            if (folder / "config.json").is_file():
                raise ModelLoadError(
                    f"{folder} is a checkpoint, not an exported model (it has no {MANIFEST}): "
                    f"export it first (prune export --model {folder} --out {folder.name}-onnx), "
                    "or run it with PyTorch (--backend torch)"
                )
            raise ModelLoadError(
                f"{folder}: no {MANIFEST}, so not an exported model; export a checkpoint into a "
                "folder of its own first (prune export --model CHECKPOINT --out FOLDER)"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"{path}: corrupted manifest ({exc})") from exc
        return cls.from_dict(data, where=str(path))

    @classmethod
    def from_dict(cls, data: Any, where: str = "manifest") -> Manifest:
        """A manifest from its JSON (a file's, or what a Triton core model sends), checked."""
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
            raise ModelLoadError(f"{where}: not a {MANIFEST_FORMAT} manifest")
        if data.get("kind") == COMPRESSOR:
            raise ModelLoadError(
                f"{where}: an LLMLingua-2 export (a token compressor, family {data.get('family')}), not a "
                "pruning model: open it with Compressor.load (prune compress --model, prune api --model)"
            )
        for key in ("family", "max_length", "tokenizer", "graph"):
            if key not in data:
                raise ModelLoadError(f"{where}: manifest lacks {key!r}")
        try:
            tok, src = data["tokenizer"], data.get("source")
            rows = data.get("embedding_rows")
            manifest = cls(
                family=str(data["family"]),
                max_length=int(data["max_length"]),
                tokenizer=TokenizerInfo(
                    cls_id=int(tok["cls_id"]),
                    sep_id=int(tok["sep_id"]),
                    pad_id=int(tok["pad_id"]),
                    file=str(tok.get("file") or "tokenizer.json"),
                    seps_between=None if tok.get("seps_between") is None else int(tok["seps_between"]),
                ),
                graph=str(data["graph"]),
                external_data=data.get("external_data") or None,
                inputs=tuple(str(n) for n in data.get("inputs") or ()),
                buckets=tuple(int(b) for b in data.get("buckets") or ()),
                precision=data.get("precision"),
                defaults=dict(data.get("defaults") or {}),
                embedding_rows=rows if isinstance(rows, int) and not isinstance(rows, bool) else 0,
                source=None
                if not isinstance(src, dict)
                else Source(
                    checkpoint=str(src.get("checkpoint", "")),
                    weights_sha256=src.get("weights_sha256"),
                    num_attention_heads=src.get("num_attention_heads"),
                    hidden_size=src.get("hidden_size"),
                ),
                options=dict(data.get("options") or {}),
                tensorrt=data.get("tensorrt"),
                runtime=_runtime(data.get("runtime"), where),
                data=dict(data),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ModelLoadError(f"{where}: manifest is incomplete: {exc}") from exc
        try:
            manifest.spec()  # its values checked
        except ModelLoadError as exc:
            raise ModelLoadError(f"{where}: {exc}") from None
        return manifest

    # ------------------------------------------------------------------ using
    def spec(self, name: str = "model") -> ModelSpec:
        """What the client needs: the family with this export's defaults, the window, the
        special tokens; ModelLoadError when a value is out of bounds."""
        family = get_family(self.family)
        try:
            family = replace(family, rules=family.rules.overridden(self.defaults))
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"manifest defaults: {exc}") from None
        seps = self.tokenizer.seps_between
        if seps is not None and seps != family.seps_between:
            family = replace(family, seps_between=seps)  # e.g. OpenProvence on ModernBERT
        spec = ModelSpec(
            family=family,
            max_length=self.max_length,
            cls_id=self.tokenizer.cls_id,
            sep_id=self.tokenizer.sep_id,
            pad_id=self.tokenizer.pad_id,
            name=name,
            precision=self.precision or "fp32",
            auto_pick="auto" in self.data,
        )
        if not 16 <= spec.max_length <= MAX_WINDOW:
            raise ModelLoadError(f"manifest max_length {spec.max_length} is outside 16..{MAX_WINDOW}")
        if min(spec.cls_id, spec.sep_id, spec.pad_id) < 0:
            raise ModelLoadError("manifest special token ids must be >= 0")
        b = list(self.buckets)
        if b and (b != sorted(set(b)) or b[0] < 1 or b[-1] > spec.max_length):
            raise ModelLoadError(f"manifest buckets {b[:6]}... are not increasing lengths within the window")
        return spec

    # ------------------------------------------------------------------ writing
    def to_dict(self) -> dict[str, Any]:
        """The JSON form: `data` with the typed fields written over it."""
        out = dict(self.data)
        out.update(
            format=MANIFEST_FORMAT,
            family=self.family,
            max_length=self.max_length,
            graph=self.graph,
            external_data=self.external_data,
            inputs=list(self.inputs),
            buckets=list(self.buckets),
            precision=self.precision,
            embedding_rows=self.embedding_rows,
            options=self.options,
        )
        tok = dict(out.get("tokenizer") or {})
        tok.update(
            cls_id=self.tokenizer.cls_id,
            sep_id=self.tokenizer.sep_id,
            pad_id=self.tokenizer.pad_id,
            file=self.tokenizer.file,
        )
        if self.tokenizer.seps_between is not None:
            tok["seps_between"] = self.tokenizer.seps_between
        out["tokenizer"] = tok
        out["defaults"] = dict(self.defaults)
        if self.source is not None:
            out["source"] = {
                **(out.get("source") or {}),
                **{k: v for k, v in asdict(self.source).items() if v is not None},
            }
        if self.tensorrt is not None:
            out["tensorrt"] = self.tensorrt
        if self.runtime is not None:
            out["runtime"] = asdict(self.runtime)
        else:
            out.pop("runtime", None)
        return out

    def write(self, folder: str | Path) -> None:
        """`manifest.json` in `folder`."""
        (Path(folder) / MANIFEST).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def with_changes(self, **changes: Any) -> Manifest:
        """This manifest with fields changed (the rest of its data kept)."""
        return replace(self, **changes)


def _runtime(value: Any, where: str) -> Runtime | None:
    """The manifest's `runtime`, checked against RUNTIMES."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("backend") not in RUNTIMES:
        raise ModelLoadError(f"{where}: runtime must name a backend of {sorted(RUNTIMES)}, got {value!r}")
    runtime = Runtime(backend=value["backend"], precision=value.get("precision", "fp32"))
    if runtime.precision not in RUNTIMES[runtime.backend]:
        raise ModelLoadError(
            f"{where}: {runtime.backend} runs at {', '.join(RUNTIMES[runtime.backend])}, "
            f"not {runtime.precision!r}"
        )
    return runtime


@dataclass(frozen=True)
class CompressorManifest:
    """An LLMLingua-2 export's `manifest.json` (kind "compressor"), typed: the graph (input_ids,
    attention_mask -> token_probs), its precision, and the embedding rows it carries (the
    tokenizer with llmlingua's 100 added tokens). The rest is kept in `data`, written as it was."""

    family: str
    layout: str  # xlm-roberta or bert
    graph: str
    precision: str
    embedding_rows: int
    tokenizer_file: str = "tokenizer.json"
    #: the runtime it prefers (`prune export --precision auto`'s pick: OpenVINO bf16 of the fp32 graph)
    runtime: Runtime | None = None
    data: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def read(cls, folder: str | Path) -> CompressorManifest:
        """The manifest of an exported LLMLingua-2 folder; ModelLoadError saying what the folder
        is when it is another export."""
        path = Path(folder) / MANIFEST
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{path}: no readable manifest ({exc})") from None
        return cls.from_dict(data, where=str(folder))

    @classmethod
    def from_dict(cls, data: Any, where: str = "manifest") -> CompressorManifest:
        """The manifest from its JSON, checked."""
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
            raise ModelLoadError(f"{where}: not a {MANIFEST_FORMAT} manifest")
        if data.get("kind") != COMPRESSOR:
            raise ModelLoadError(
                f"{where} is a pruning export (family {data.get('family')!r}), not an LLMLingua-2 compressor: "
                "open it with Pruner.load (prune run, prune api --model), or give Compressor.load an "
                "LLMLingua-2 checkpoint or its export (prune export --model CHECKPOINT)"
            )
        try:
            manifest = cls(
                family=str(data["family"]),
                layout=str(data["layout"]),
                graph=str(data["graph"]),
                precision=str(data["precision"]),
                embedding_rows=int(data["embedding_rows"]),
                tokenizer_file=str((data.get("tokenizer") or {}).get("file") or "tokenizer.json"),
                runtime=_runtime(data.get("runtime"), where),
                data=dict(data),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{where}: the compressor's manifest is incomplete: {exc}") from None
        if manifest.layout not in ("xlm-roberta", "bert") or manifest.embedding_rows < 1:
            raise ModelLoadError(f"{where}: layout {manifest.layout!r}, rows {manifest.embedding_rows}")
        return manifest

    def write(self, folder: str | Path) -> None:
        """`manifest.json` in `folder`: `data` with the typed fields written over it."""
        out = {**self.data, "format": MANIFEST_FORMAT, "kind": COMPRESSOR, "family": self.family}
        out.update(layout=self.layout, graph=self.graph, precision=self.precision)
        out.update(embedding_rows=self.embedding_rows)
        out["tokenizer"] = {**(out.get("tokenizer") or {}), "file": self.tokenizer_file}
        if self.runtime is not None:
            out["runtime"] = asdict(self.runtime)
        else:
            out.pop("runtime", None)
        (Path(folder) / MANIFEST).write_text(json.dumps(out, indent=2) + "\n")
