"""The lexical baseline of `prune eval`: Okapi BM25 over engine.pipeline.decide's lexical words, for
sentences (against the question) and for a call's passages (its ranking)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import numpy as np

from engine.pipeline.decide import lexical_words
from engine.datafiles import PruneSample, RagSample

#: the words BM25 counts: engine.pipeline.decide's lexical_words (case-folded; CJK as character bigrams)
words = lexical_words


class BM25:
    """Okapi BM25 (k1=1.5, b=0.75) with IDF from `corpus` (lists of words)."""

    def __init__(self, corpus: Sequence[Sequence[str]], k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        n = len(corpus)
        df = Counter(w for doc in corpus for w in set(doc))
        self.idf = {w: math.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}
        self.avgdl = sum(len(d) for d in corpus) / max(n, 1) or 1.0

    def score(self, query: Sequence[str], doc: Sequence[str]) -> float:
        """BM25 score of `doc` for `query` (word lists)."""
        tf = Counter(doc)
        norm = self.k1 * (1 - self.b + self.b * len(doc) / self.avgdl)
        return sum(
            self.idf.get(w, 0.0) * tf[w] * (self.k1 + 1) / (tf[w] + norm) for w in set(query) if w in tf
        )


def bm25_sentence_scores(samples: Sequence[PruneSample]) -> list[np.ndarray]:
    """Each sentence's BM25 against the question, divided by the document's best (0..1)."""
    sent_words = [[words(s.context[a:b]) for a, b in s.spans] for s in samples]
    bm = BM25([w for doc in sent_words for w in doc])
    out = []
    for s, doc in zip(samples, sent_words):
        q = words(s.question)
        sc = np.array([bm.score(q, w) for w in doc], dtype=np.float64)
        out.append(sc / sc.max() if sc.size and sc.max() > 0 else sc)
    return out


def bm25_rankings(samples: Sequence[RagSample]) -> list[list[float]]:
    """Each sample's passages scored by BM25 against its question."""
    corpus = [words(p) for s in samples for p in s.passages]
    bm = BM25(corpus)
    return [[bm.score(words(s.question), words(p)) for p in s.passages] for s in samples]
