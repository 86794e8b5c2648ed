"""The documents `prune index` takes: a JSONL or JSON file read and checked (ids, text, the
limits Milvus sets), and cut into chunks at sentence boundaries within the encoder's window."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.datafiles import json_error
from engine.errors import InputError
from engine.pipeline.text import split_sentences

CHUNK_TOKENS = 200  # tokens of the encoder per chunk (all-MiniLM-L6-v2 reads 256)
MAX_ID_CHARS = 512
MAX_TEXT_BYTES = 65_535  # Milvus's VARCHAR limit


def read_documents(path: str | Path) -> list[dict[str, Any]]:
    """JSONL documents: one object per line with at least `id` and `text` (a non-empty
    string); other fields are kept as metadata. Errors name the line."""
    docs, seen = [], set()
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from exc
    with fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}: line {n}: not valid JSON: {json_error(exc, line)}") from exc
            docs.append(check_document(doc, f"{path}:{n}"))
            if docs[-1]["id"] in seen:
                raise InputError(f"{path}:{n}: id {docs[-1]['id']!r} appears twice")
            seen.add(docs[-1]["id"])
    if not docs:
        raise InputError(f"{path}: no documents")
    return docs


def check_document(doc: Any, where: str) -> dict[str, Any]:
    """A document of an index file, checked: {id, text, ...}; InputError naming `where` otherwise."""
    if not isinstance(doc, dict):
        raise InputError(f"{where}: a document is a JSON object with id and text, got {type(doc).__name__}")
    if "id" not in doc or not isinstance(doc["id"], (str, int)) or isinstance(doc["id"], bool):
        raise InputError(f"{where}: a document needs an id (string or integer)")
    if not isinstance(doc.get("text"), str) or not doc["text"].strip():
        raise InputError(f"{where}: a document needs a non-empty string text")
    if len(str(doc["id"])) > MAX_ID_CHARS:
        raise InputError(f"{where}: id is {len(str(doc['id']))} characters; at most {MAX_ID_CHARS}")
    return {**doc, "id": str(doc["id"])}


def chunk_spans(text: str, embedder: Any, max_tokens: int = CHUNK_TOKENS) -> list[tuple[int, int]]:
    """Character spans of the chunks of `text`: whole sentences packed greedily up to
    `max_tokens` encoder tokens; a sentence longer than that is cut at token boundaries
    into pieces of `max_tokens`. Every non-space character lands in exactly one chunk."""
    if max_tokens < 8:
        raise InputError(f"chunk_tokens must be at least 8, got {max_tokens}")
    sentences = split_sentences(text)
    counts = embedder.token_counts([text[s:e] for s, e in sentences])
    chunks: list[tuple[int, int]] = []
    start: int | None = None
    used = prev_end = 0
    for (s, e), n in zip(sentences, counts):
        if n > max_tokens:
            if start is not None:
                chunks.append((start, prev_end))
                start, used = None, 0
            offsets = embedder.token_offsets(text[s:e])
            for i in range(0, len(offsets), max_tokens):
                a = s + (offsets[i][0] if i else 0)
                b = s + offsets[i + max_tokens][0] if i + max_tokens < len(offsets) else e
                while b > a and text[b - 1].isspace():
                    b -= 1
                chunks.append((a, b))
            continue
        # the separator between sentences costs no token; a chunk's count is the sum
        if start is not None and used + n > max_tokens:
            chunks.append((start, prev_end))
            start, used = None, 0
        if start is None:
            start = s
        used += n
        prev_end = e
    if start is not None:
        chunks.append((start, prev_end))
    return [(a, b) for a, b in chunks if text[a:b].strip()]
