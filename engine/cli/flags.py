"""What several commands share: flags from engine.settings, the batching and call-option
flags, the embedding family's export options, the default model, the RAG database, and the
checks of files and numbers that make a bad input one line and exit 2 before any model loads."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from engine.errors import PruneError
from engine.pipeline.families import FAMILIES
from engine.pipeline.inputs import OPTION_NAMES, WINDOWS, CallOptions, check_tags
from engine.pipeline.option_schema import option_choices, option_help, option_type
from engine.settings import SETTINGS, help_text, setting
from engine.pipeline.spec import RUNTIMES


def add_setting(p, name: str, extra: str = "", **kwargs) -> None:
    """A flag from engine.settings: its default is the PRUNE_* variable when set, else the
    setting's default; its help says what it does, its variable and its default, once."""
    s = SETTINGS[name]
    if s.type is not str:
        kwargs.setdefault("type", s.type)
    if s.choices:
        kwargs.setdefault("choices", s.choices)
    p.add_argument(s.flag, default=setting(name), help=help_text(name, extra), **kwargs)


def input_file(path: str | None, flag: str) -> None:
    """A PruneError (one line) unless `path` is a file this process can read; None and '-'
    (stdin) pass. Commands check their files with this before any model loads."""
    if path is None or path == "-":
        return
    p = Path(path)
    if not p.exists():
        raise PruneError(f"{flag} {path}: no such file")
    if p.is_dir():
        raise PruneError(f"{flag} {path}: is a folder, not a file")
    if not os.access(p, os.R_OK):
        raise PruneError(f"{flag} {path}: cannot be read (permission denied)")


def output_file(path: str | None, flag: str, make_folders: bool = False) -> None:
    """A PruneError (one line) unless a file can be written at `path`: not a folder, its
    folder a writable one (or, with `make_folders`, one the command makes: its nearest
    existing parent writable); None and '-' (stdout) pass."""
    if path is None or path == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise PruneError(f"{flag} {path}: is a folder; give a file name")
    if make_folders:
        output_folder(str(p.parent), flag, path)
    else:
        _writable_folder(p.parent, flag, path)


def output_folder(path: str | None, flag: str, named: str | None = None) -> None:
    """A PruneError (one line) unless `path` is a folder, or one the command can make: not
    a file, and its nearest existing parent a writable folder."""
    if path is None:
        return
    named = named or path
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise PruneError(
            f"{flag} {named}: " + ("" if named == path else f"{path} ") + "is a file, not a folder"
        )
    parent = p if p.exists() else next(a for a in p.parents if a.exists())
    _writable_folder(parent, flag, named)


def _writable_folder(folder: Path, flag: str, path: str) -> None:
    if not folder.is_dir():
        raise PruneError(
            f"{flag} {path}: no folder {folder} (make it first)"
            if not folder.exists()
            else f"{flag} {path}: {folder} is a file, not a folder"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PruneError(f"{flag} {path}: cannot write into {folder} (permission denied)")


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


positive_float.__name__ = "positive number"  # what argparse's error calls it


def non_negative_int(text: str) -> int:
    """argparse type: an int >= 0."""
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


non_negative_int.__name__ = "non-negative integer"


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 to 65535."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(text)
    return value


port_number.__name__ = "port (0-65535)"


def add_compressor(p: argparse.ArgumentParser, more: str = "") -> None:
    """--compressor: a token compressor beside the pruner (LLMLingua-2), for compress_rate."""
    p.add_argument(
        "--compressor",
        metavar="DIR",
        help="an LLMLingua-2 checkpoint or export beside the pruner: a call's compress_rate or "
        "compress_target_token runs it on what the call keeps (on --device: cuda takes an export)" + more,
    )


def load_compressor(args, folder: str | None = None):
    """`folder` (by default the --compressor given) loaded as an engine.Compressor with the
    command's --threads, --device, --merge-calls and notes, or None where there is none."""
    folder = folder or getattr(args, "compressor", None)
    if not folder:
        return None
    from engine.compressor import Compressor

    merge = {"merge_calls": args.merge_calls} if getattr(args, "merge_calls", None) else {}
    return Compressor.load(
        folder,
        threads=args.threads,
        device=getattr(args, "device", "cpu"),
        log=getattr(args, "log", None),
        **merge,
    )


def compressor_named(args, pruner) -> str:
    """The compressor loaded beside `pruner` in words ("compressor lingua-int8 (LLMLingua-2 ... )"),
    as start-up lines name it; "" when there is none."""
    compressor = getattr(pruner, "compressor", None)
    if compressor is None:
        return ""
    name = Path(args.compressor).name if getattr(args, "compressor", None) else "(given)"
    return f"compressor {name} ({compressor.describe()})"


def add_batching(p: argparse.ArgumentParser) -> None:
    """--max-batch-tokens, --max-batch-size, --threads."""
    add_setting(p, "max_batch_tokens")
    add_setting(p, "max_batch_size")
    add_setting(p, "threads")


def add_windows(p: argparse.ArgumentParser) -> None:
    """--windows."""
    p.add_argument(
        "--windows",
        choices=list(WINDOWS),
        help="how a long passage is cut: as the family's own code (reference: OpenSearch's 510-token "
        "windows with stride 128 and a decision per window; OpenProvence's fragments of half "
        "the window averaged without weights) or sentence-aligned blocks with one decision per "
        "passage and token-weighted pieces (default: the family's own: "
        + ", ".join(f"{f.name} {f.rules.windows}" for f in FAMILIES.values())
        + ")",
    )


def add_call_options(p: argparse.ArgumentParser) -> None:
    """One flag per option of a call (engine.pipeline.inputs.CallOptions), with its own meaning;
    unset: the model's default."""
    for name in OPTION_NAMES:
        flag, kind, choices = "--" + name.replace("_", "-"), option_type(name), option_choices(name)
        if kind is bool:
            p.add_argument(flag, action="store_true", help=option_help(name))
        else:
            p.add_argument(
                flag, type=kind, choices=choices, help=option_help(name) + " (default: the model's)"
            )


def call_options(args) -> "CallOptions":
    """The CallOptions of `prune run`'s flags (checked: a bad value is an error before any
    model loads). Unset is None (a switch's False); 0 is a value (`--lexical-weight 0`)."""
    return CallOptions.of_attributes(args)


def add_tags(p: argparse.ArgumentParser, when: str = "") -> None:
    """--pre and --post: the tags around a kept sentence (a pair, `tags`)."""
    p.add_argument("--pre", help=f"tag before a kept sentence{when}, with --post (default: <em>)")
    p.add_argument("--post", help=f"tag after a kept sentence{when}, with --pre (default: </em>)")


def tags(args) -> tuple[str, str]:
    """(pre, post) of --pre and --post: both, or neither (<em> and </em>); one alone is an
    InputError before any model loads (engine.pipeline.inputs.check_tags: tags come in pairs)."""
    return (
        (args.pre, args.post) if check_tags(args.pre, args.post, ("--pre", "--post")) else ("<em>", "</em>")
    )


def batching(args):
    """The BatchingConfig the flags ask for."""
    from engine.pipeline.encode import BatchingConfig

    return BatchingConfig(max_batch_tokens=args.max_batch_tokens, max_batch_size=args.max_batch_size)


def add_embedding_options(p: argparse.ArgumentParser) -> None:
    """The embedding family's export options (--mode, --pooling, ...)."""
    g = p.add_argument_group("embedding family (sentence-embedding encoders)")
    g.add_argument(
        "--embedding-mode",
        choices=["isolated", "passage", "full"],
        help="what a sentence's tokens attend to (default isolated: each sentence alone)",
    )
    g.add_argument("--similarity-scale", type=float, help="p = sigmoid(scale * (cos - shift)); default 8")
    g.add_argument("--similarity-shift", type=float, help="cosine that maps to p = 0.5; default 0.5")
    g.add_argument(
        "--embedding-rerank",
        choices=["max", "mean"],
        help="passage score: best sentence cosine (max) or cosine with the passage mean",
    )


def embedding_options(args) -> dict:
    """The embedding export options the flags ask for."""
    return {
        k: v
        for k, v in {
            "mode": getattr(args, "embedding_mode", None),
            "scale": getattr(args, "similarity_scale", None),
            "shift": getattr(args, "similarity_shift", None),
            "rerank": getattr(args, "embedding_rerank", None),
        }.items()
        if v is not None
    }


def model_path(args) -> str:
    """--model, or the default model: exported (onnxruntime) or its checkpoint (torch)."""
    if args.model and args.model != "default":
        return args.model
    from engine.models.default_model import default_model

    return str(default_model(args.backend, getattr(args, "device", "cpu"), args.log))


def api_imports():
    """FastAPI and uvicorn, or a PruneError saying which extra installs them."""
    try:
        import uvicorn
        from engine.http.app import ApiConfig, create_app
    except ImportError as exc:
        raise PruneError(
            f"the HTTP API needs FastAPI and uvicorn (missing here: {exc.name}): "
            "pip install 'prune-engine[api]'"
        ) from exc
    return uvicorn, ApiConfig, create_app


def pipeline(args):
    """The RAG pipeline the flags describe."""
    from engine.rag.retrieval import Pipeline

    return Pipeline(
        args.db, collection=args.collection, token=args.token or os.environ.get("MILVUS_TOKEN"), log=args.log
    )


def load_models(args, pipe, with_pruner: bool) -> None:
    """Open the pipeline's encoder (and its pruner when `with_pruner`), logging progress."""
    from engine.rag.embedder import Embedder

    if getattr(args, "mode", "hybrid") != "bm25":
        pipe.embedder = Embedder.load(args.encoder, threads=args.threads, log=args.log)
    if with_pruner:
        from engine.pruner import Pruner

        if args.server:
            pipe.pruner = Pruner.connect(
                args.server, args.text_model or "default_text", protocol=args.protocol, timeout=args.timeout
            )
        else:
            args.backend = "onnxruntime"
            pipe.pruner = Pruner.load(model_path(args), threads=args.threads, log=args.log)


def add_db(x: argparse.ArgumentParser) -> None:
    """--db, --collection."""
    x.add_argument(
        "--db",
        required=True,
        help="a Milvus Lite file (created by prune index), or a Milvus server's URI (http://host:19530)",
    )
    x.add_argument("--collection", default="passages", help="the collection's name")
    x.add_argument("--token", help="a Milvus server's token, user:password (env MILVUS_TOKEN)")
    x.add_argument(
        "--encoder",
        default="default",
        help="exported encoder folder (prune export --encoder), "
        "or 'default' (all-MiniLM-L6-v2's, exported on first use)",
    )
    add_setting(x, "threads")


def add_openvino(p, backends: tuple[str, ...]) -> None:
    """`--backend` (of `backends`) and OpenVINO's `--inference-precision`."""
    p.add_argument(
        "--backend",
        choices=list(backends),
        default=None,
        help="onnxruntime (an exported folder); openvino (the same folder on OpenVINO, pip install "
        "'prune-engine[openvino]'; an ov-int8 export runs there whatever this says)"
        + ("; torch: a checkpoint (the fp32 reference)" if "torch" in backends else "")
        + ". Default: the runtime the export's manifest prefers (prune export --precision auto), "
        "else onnxruntime",
    )
    p.add_argument(
        "--inference-precision",
        choices=list(RUNTIMES["openvino"]),
        default=None,
        help="OpenVINO: bf16 inference of the fp32 graph (CPUs with AVX512_BF16 or AMX); "
        "default: the export's preferred runtime's, else fp32",
    )
