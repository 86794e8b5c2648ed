"""Retrieve, rerank, prune, highlight: one pipeline on Milvus.

`prune index` chunks documents at sentence boundaries, embeds the chunks with the
engine's ONNX encoder (engine.rag.embedder) and stores text, vectors and Milvus's built-in BM25
full-text index in one collection. `prune ask` runs hybrid retrieval (dense + BM25,
fused by Milvus with reciprocal-rank fusion), reranks the candidates by the pruner's
reranking score, prunes them and returns the pruned context with its sources.

    from engine.rag.retrieval import Pipeline
    with Pipeline("rag.db") as p:                 # Milvus Lite file, or "http://host:19530"
        p.index(documents)                        # [{"id": ..., "text": ..., other fields}]
        answer = p.ask("Who built the castle?", k=5)
        print(answer.context())

`semantic_highlight(results, pruner, ...)` adds highlights shaped like Milvus's hosted
semantic highlighter to pymilvus search results.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import engine
from engine.pipeline.inputs import check_threshold
from engine.errors import InputError, ModelLoadError, PruneError
from engine.rag.answers import Answer, AskResult, IndexReport
from engine.rag.documents import CHUNK_TOKENS, MAX_ID_CHARS, MAX_TEXT_BYTES, check_document, chunk_spans

COLLECTION = "passages"
#: seconds a local Milvus Lite database is given to start its server (pymilvus retried meanwhile)
LITE_START_S = 60
CANDIDATES = 20  # retrieved per question before reranking
K = 5  # returned after reranking
MODES = ("hybrid", "dense", "bm25")
RRF_K = 60  # reciprocal-rank fusion constant (Milvus's default)
INSERT_ROWS = 256
MAX_CANDIDATES = 1_000


class PipelineError(PruneError, RuntimeError):
    """The vector database is missing, unreadable, or not what the pipeline built."""


def _milvus():
    try:
        import pymilvus
    except ImportError as exc:
        raise ModelLoadError(
            "the retrieval pipeline needs Milvus: pip install 'prune-engine[milvus]'"
        ) from exc
    return pymilvus


def _not_answering(exc: Exception) -> bool:
    """Whether pymilvus could not reach a server's socket (which a starting Milvus Lite opens
    late), as opposed to a server that refused to start (a file that is not a database)."""
    return "Fail connecting to server" in str(getattr(exc, "message", exc))


def is_local(db: str) -> bool:
    """Whether `db` is a Milvus Lite file (not a server URI)."""
    return "://" not in str(db)


# ----------------------------------------------------------------------------- pipeline


class Pipeline:
    """A Milvus collection built by `index` and queried by `ask`.

    db: a Milvus Lite file (created by `index`) or a server URI (`http://host:19530`).
    pruner / embedder: loaded on first use ("default" model) when not given.
    """

    def __init__(
        self,
        db: str | Path,
        pruner: Any = None,
        embedder: Any = None,
        *,
        collection: str = COLLECTION,
        token: str | None = None,
        log: Callable[[str], None] | None = None,
    ):
        self.db, self.collection, self.token = str(db), collection, token
        self._pruner, self._embedder = pruner, embedder
        self.log = log or (lambda m: None)
        self._client = None
        self._about: dict[str, Any] | None = None

    # -- resources
    @property
    def client(self):
        """The Milvus client (opened on first use)."""
        if self._client is None:
            self._client = self._connect(create=False)
        return self._client

    def _connect(self, create: bool):
        pymilvus = _milvus()
        if is_local(self.db):
            path = Path(self.db)
            if path.suffix != ".db":
                raise PipelineError(
                    f"{self.db}: a Milvus Lite database is a file whose name ends in .db "
                    "(for example rag.db); a Milvus server is a URI such as http://host:19530"
                )
            if not create and not path.exists():
                raise PipelineError(
                    f"{self.db}: no such Milvus Lite database; build it with prune index "
                    "--db FILE --data docs.jsonl"
                )
            if path.is_dir():
                raise PipelineError(
                    f"{self.db} is a folder; a Milvus Lite database is a file (for example rag.db)"
                )
            path.parent.mkdir(parents=True, exist_ok=True)
        kwargs = {"uri": str(Path(self.db).resolve()) if is_local(self.db) else self.db}
        if self.token:
            kwargs["token"] = self.token
        # Milvus Lite starts a server process of its own and pymilvus connects to its socket: on a
        # busy machine the socket can come later than pymilvus waits, so a local database is
        # retried until LITE_START_S have passed (a server's URI is not: it is up or it is not; nor is a
        # Milvus Lite that failed to start, which pymilvus says at once)
        deadline = time.monotonic() + (LITE_START_S if is_local(self.db) else 0)
        said = False
        while True:
            try:
                with warnings.catch_warnings():  # milvus-lite 2.5 imports the deprecated pkg_resources
                    warnings.filterwarnings("ignore", message="pkg_resources is deprecated")
                    return pymilvus.MilvusClient(**kwargs)
            except Exception as exc:
                if _not_answering(exc) and time.monotonic() < deadline:
                    if not said:
                        self.log(
                            f"{self.db}: Milvus Lite is starting; waiting up to {LITE_START_S} s for it ..."
                        )
                        said = True
                    time.sleep(0.5)
                    continue
                what = "a Milvus Lite database" if is_local(self.db) else "a Milvus server"
                waited = (
                    f" (Milvus Lite did not answer within {LITE_START_S} s)"
                    if is_local(self.db) and _not_answering(exc)
                    else ""
                )
                raise PipelineError(
                    f"{self.db}: cannot open it as {what}{waited} ({type(exc).__name__}: "
                    f"{getattr(exc, 'message', exc)})"
                ) from exc

    @property
    def pruner(self):
        """The pruner (loaded on first use)."""
        if self._pruner is None:
            from engine.pruner import Pruner

            self._pruner = Pruner.load("default")
        return self._pruner

    @pruner.setter
    def pruner(self, value) -> None:
        self._pruner = value

    @property
    def embedder(self):
        """The retrieval encoder (loaded on first use)."""
        if self._embedder is None:
            from engine.rag.embedder import Embedder

            self._embedder = Embedder.load("default", log=self.log)
        return self._embedder

    @embedder.setter
    def embedder(self, value) -> None:
        self._embedder = value

    def close(self) -> None:
        """Close the connection; for a Milvus Lite file, also stop the embedded server
        this process started for it (it would otherwise live until the process exits)."""
        if self._client is not None:
            self._client.close()
            self._client = None
            if is_local(self.db):
                try:
                    from milvus_lite.server_manager import server_manager_instance
                except ImportError:
                    return
                path = Path(self.db).resolve()
                if str(path) in getattr(server_manager_instance, "_servers", {}):
                    server_manager_instance.release_server(str(path))

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- index
    def index(
        self,
        documents: Iterable[dict[str, Any]],
        *,
        chunk_tokens: int = CHUNK_TOKENS,
        overwrite: bool = False,
    ) -> IndexReport:
        """Chunk, embed and store `documents` (dicts with id, text and metadata) in a new
        collection. An existing collection is an error unless `overwrite`."""
        t0 = time.perf_counter()
        docs = [check_document(d, f"document {i}") for i, d in enumerate(documents)]
        if not docs:
            raise InputError("no documents to index")
        embedder = self.embedder
        if chunk_tokens + 2 > embedder.max_length:
            raise InputError(
                f"chunk_tokens {chunk_tokens} does not fit the encoder's window of "
                f"{embedder.max_length} tokens (2 are special tokens)"
            )
        rows = []
        for doc in docs:
            meta = {k: v for k, v in doc.items() if k not in ("id", "text")}
            for n, (s, e) in enumerate(chunk_spans(doc["text"], embedder, chunk_tokens)):
                text = doc["text"][s:e]
                if len(text.encode("utf-8")) > MAX_TEXT_BYTES:
                    raise InputError(
                        f"document {doc['id']}: chunk {n} is over Milvus's {MAX_TEXT_BYTES} bytes"
                    )
                rows.append(
                    {"doc_id": doc["id"], "chunk": n, "start": s, "end": e, "text": text, "metadata": meta}
                )
        self.log(f"{len(docs)} documents -> {len(rows)} chunks of at most {chunk_tokens} tokens")
        client = self._client or self._connect(create=True)
        self._client = client
        if client.has_collection(self.collection):
            if not overwrite:
                raise PipelineError(
                    f"collection {self.collection!r} already exists in {self.db}; --overwrite rebuilds it"
                )
            client.drop_collection(self.collection)
        self._about = None
        self._create(client, embedder, chunk_tokens, len(docs))
        t_embed = 0.0
        for b in range(0, len(rows), INSERT_ROWS):
            part = rows[b : b + INSERT_ROWS]
            t1 = time.perf_counter()
            vectors = embedder.encode([r["text"] for r in part], what="chunk")
            t_embed += time.perf_counter() - t1
            for r, v in zip(part, vectors):
                r["dense"] = v.tolist()
            client.insert(self.collection, part)
            self.log(
                f"  embedded and stored {min(b + INSERT_ROWS, len(rows))}/{len(rows)} chunks "
                f"({(b + len(part)) / max(t_embed, 1e-9):.0f} chunks/s embedding)"
            )
        return IndexReport(
            documents=len(docs),
            chunks=len(rows),
            seconds=time.perf_counter() - t0,
            embed_seconds=t_embed,
            collection=self.collection,
            db=self.db,
        )

    def _create(self, client, embedder, chunk_tokens: int, documents: int) -> None:
        pymilvus = _milvus()
        DataType, Function, FunctionType = pymilvus.DataType, pymilvus.Function, pymilvus.FunctionType
        about = {
            "prune-engine": engine.__version__,
            "embedder": embedder.name,
            "dim": embedder.dim,
            "chunk_tokens": chunk_tokens,
            "documents": documents,
        }
        schema = client.create_schema(auto_id=True, description=json.dumps(about))
        schema.add_field("pk", DataType.INT64, is_primary=True)
        schema.add_field("doc_id", DataType.VARCHAR, max_length=MAX_ID_CHARS * 4)
        schema.add_field("chunk", DataType.INT64)
        schema.add_field("start", DataType.INT64)
        schema.add_field("end", DataType.INT64)
        schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES, enable_analyzer=True)
        schema.add_field("metadata", DataType.JSON)
        schema.add_field("dense", DataType.FLOAT_VECTOR, dim=embedder.dim)
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        schema.add_function(
            Function(
                name="text_bm25",
                function_type=FunctionType.BM25,
                input_field_names=["text"],
                output_field_names=["sparse"],
            )
        )
        index = client.prepare_index_params()
        index.add_index("dense", index_type="AUTOINDEX", metric_type="IP")  # unit vectors: cosine
        index.add_index("sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
        client.create_collection(
            self.collection, schema=schema, index_params=index, consistency_level="Strong"
        )

    # -- query
    def about(self) -> dict[str, Any]:
        """What `index` recorded: engine version, embedder, dimension, chunk size. Read once
        per pipeline (and again after its own `index`), not on every question."""
        if self._about is not None:
            return self._about
        client = self.client
        if not client.has_collection(self.collection):
            names = client.list_collections()
            raise PipelineError(
                f"no collection {self.collection!r} in {self.db}"
                + (f" (it has {', '.join(map(repr, names))})" if names else " (it is empty)")
                + "; build it with prune index"
            )
        desc = client.describe_collection(self.collection).get("description") or ""
        try:
            about = json.loads(desc)
        except json.JSONDecodeError:
            about = None
        if not isinstance(about, dict) or "prune-engine" not in about:
            raise PipelineError(f"collection {self.collection!r} in {self.db} was not built by prune index")
        self._about = about
        return about

    def search(self, question: str, *, mode: str = "hybrid", limit: int = CANDIDATES) -> list[dict[str, Any]]:
        """Milvus hits (dicts with id, distance, entity) for `question`, best first."""
        return self._search(question, mode, limit, {})

    def _search(
        self, question: str, mode: str, limit: int, timings: dict[str, float]
    ) -> list[dict[str, Any]]:
        if not isinstance(question, str) or not question.strip():
            raise InputError("question must be a non-empty string")
        if mode not in MODES:
            raise InputError(f"mode must be one of {MODES}, got {mode!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CANDIDATES:
            raise InputError(
                f"the number of candidates must be an integer in 1..{MAX_CANDIDATES}, got {limit!r}"
            )
        about = self.about()
        pymilvus = _milvus()
        fields = ["doc_id", "chunk", "start", "end", "text", "metadata"]
        vector = None
        if mode != "bm25":
            embedder = self.embedder
            if embedder.dim != about["dim"] or embedder.name != about["embedder"]:
                raise PipelineError(
                    f"the collection was embedded with {about['embedder']} ({about['dim']} dims); "
                    f"this pipeline's encoder is {embedder.name} ({embedder.dim} dims)"
                )
            t0 = time.perf_counter()
            vector = embedder.encode([question], what="question")[0].tolist()
            timings["embed"] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        dense = {"data": [vector], "anns_field": "dense", "param": {"metric_type": "IP"}, "limit": limit}
        sparse = {
            "data": [question],
            "anns_field": "sparse",
            "param": {"metric_type": "BM25"},
            "limit": limit,
        }
        if mode == "hybrid":
            hits = self.client.hybrid_search(
                self.collection,
                [pymilvus.AnnSearchRequest(**dense), pymilvus.AnnSearchRequest(**sparse)],
                ranker=pymilvus.RRFRanker(RRF_K),
                limit=limit,
                output_fields=fields,
            )[0]
        else:
            req = dense if mode == "dense" else sparse
            hits = self.client.search(
                self.collection,
                data=req["data"],
                anns_field=req["anns_field"],
                search_params=req["param"],
                limit=limit,
                output_fields=fields,
            )[0]
        timings["retrieve"] = (time.perf_counter() - t0) * 1e3
        return list(hits)

    def ask(
        self,
        question: str,
        *,
        k: int = K,
        candidates: int = CANDIDATES,
        mode: str = "hybrid",
        threshold: float | None = None,
        pre: str = "<em>",
        post: str = "</em>",
        rerank: bool = True,
    ) -> Answer:
        """Retrieve `candidates` chunks, rerank them by the pruner's reranking score, prune
        them, and return the best `k` with their pruned text. `rerank=False` keeps Milvus's
        order and prunes only the `k` it returns."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InputError(f"k must be a positive integer, got {k!r}")
        if threshold is not None:
            threshold = check_threshold(threshold)
        timings: dict[str, float] = {}
        t_all = time.perf_counter()
        if isinstance(candidates, bool) or not isinstance(candidates, int):
            raise InputError(f"candidates must be an integer, got {candidates!r}")
        hits = self._search(question, mode, max(candidates, k), timings)
        t0 = time.perf_counter()
        todo = hits if rerank else hits[:k]  # without reranking only the k returned are pruned
        pruned = (
            self.pruner.prune(question, [h["entity"]["text"] for h in todo], threshold=threshold)
            if todo
            else []
        )
        timings["rerank_prune"] = (time.perf_counter() - t0) * 1e3
        results = []
        for rank, (hit, res) in enumerate(zip(hits, pruned), 1):
            e = hit["entity"]
            results.append(
                AskResult(
                    id=e["doc_id"],
                    chunk=int(e["chunk"]),
                    start=int(e["start"]),
                    end=int(e["end"]),
                    text=e["text"],
                    metadata=e.get("metadata") or {},
                    retrieval_rank=rank,
                    retrieval_score=float(hit["distance"]),
                    reranking_score=res.reranking_score,
                    pruned_context=res.pruned_context,
                    highlighted=res.highlight(pre, post),
                    result=res,
                )
            )
        # best reranking score first; ties keep Milvus's order
        if rerank:
            results.sort(
                key=lambda r: (
                    -(r.reranking_score if r.reranking_score is not None else float("-inf")),
                    r.retrieval_rank,
                )
            )
        timings["total"] = (time.perf_counter() - t_all) * 1e3
        return Answer(
            question=question,
            mode=mode,
            candidates=len(hits),
            reranked=bool(rerank),
            results=results[:k],
            timings_ms={n: round(v, 2) for n, v in timings.items()},
        )
