"""`prune index`: chunk, embed and store documents in Milvus for `prune ask`."""

from __future__ import annotations

from engine.cli.flags import add_db, add_setting, input_file, load_models, output_file, pipeline


def add(new) -> None:
    """`prune index`'s flags."""
    ix = new("index", help="chunk, embed and store documents in Milvus (dense + BM25) for prune ask")
    add_db(ix)
    ix.add_argument(
        "--data", required=True, help="JSONL documents: id and text, other fields kept as metadata"
    )
    add_setting(ix, "chunk_tokens", "; a longer sentence is cut")
    ix.add_argument("--overwrite", action="store_true", help="rebuild an existing collection")
    ix.set_defaults(func=run)


def run(args) -> int:
    """Run `prune index`; the exit status."""
    from engine.rag.documents import read_documents

    input_file(args.data, "--data")  # bad input is reported before any model loads
    if "://" not in args.db:  # a Milvus Lite file, not a server's URI
        output_file(args.db, "--db")
    docs = read_documents(args.data)
    with pipeline(args) as pipe:
        load_models(args, pipe, with_pruner=False)
        report = pipe.index(docs, chunk_tokens=args.chunk_tokens, overwrite=args.overwrite)
    print(
        f"indexed {report.documents} documents as {report.chunks} chunks into {report.db} "
        f"(collection {report.collection!r}) in {report.seconds:.1f} s "
        f"({report.embed_seconds:.1f} s embedding)"
    )
    return 0
