"""A RAG-shaped file from a sentence-labelled one: each document cut into passages, as a
retrieval pipeline's chunker would, the passages that hold a labelled sentence its gold.

    python -m benchmarks.rag_from_prune --data ../shared/data/coqa-dev-prune.jsonl \\
        --out build/coqa-dev-rag.jsonl

Each document's sentences (its own `sentences` spans) are packed in order into passages of
at most `--chars` characters (a sentence longer than that is a passage of its own); a
passage is the document's text from its first sentence's start to its last sentence's
end. Output lines: `id`, `question`, `passages`, `gold` (the indices of the passages
holding a sentence labelled 1; documents with none are skipped), `source`, and `canary`
where the input carries one. `prune eval --rag-data` reads the result.

The output is derived from evaluation data: keep it with the input's licence and canary,
never train on it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def chunks(spans: list[list[int]], budget: int) -> list[list[int]]:
    """Indices of consecutive sentences, packed into passages of at most `budget` characters."""
    out: list[list[int]] = []
    cur: list[int] = []
    for i, (_, end) in enumerate(spans):
        if cur and end - spans[cur[0]][0] > budget:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def convert(row: dict, budget: int) -> dict | None:
    spans, labels, text = row["sentences"], row["labels"], row["context"]
    parts = chunks(spans, budget)
    gold = [k for k, part in enumerate(parts) if any(labels[i] for i in part)]
    if not gold:
        return None
    out = {
        "id": row.get("id"),
        "question": row["question"],
        "passages": [text[spans[part[0]][0] : spans[part[-1]][1]] for part in parts],
        "gold": gold,
        "source": row.get("source", ""),
    }
    if row.get("canary"):
        out["canary"] = row["canary"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a sentence-labelled JSONL (prune eval --data)")
    p.add_argument("--out", required=True, help="the RAG-shaped JSONL to write (prune eval --rag-data)")
    p.add_argument("--chars", type=int, default=400, help="most characters in a passage (default 400)")
    args = p.parse_args(argv)
    if args.chars < 1:
        p.error("--chars must be at least 1")
    written = skipped = passages = 0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.data, encoding="utf-8") as src, open(args.out, "w", encoding="utf-8") as dst:
        for n, line in enumerate(src, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            missing = [k for k in ("question", "context", "sentences", "labels") if k not in row]
            if missing:
                sys.exit(f"{args.data}:{n}: lacks {', '.join(missing)}: not a sentence-labelled file")
            out = convert(row, args.chars)
            if out is None:
                skipped += 1
                continue
            dst.write(json.dumps(out, ensure_ascii=False) + "\n")
            written += 1
            passages += len(out["passages"])
    print(
        f"wrote {written} calls ({passages} passages, {passages / max(written, 1):.1f} a call) to {args.out}"
        + (f"; skipped {skipped} documents without a labelled sentence" if skipped else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
