"""An in-passage lexical score, fused with the model's, beside the decisions (`lexical_weight`).

A similarity model keeps the sentence most *like* the question (often a title or a
restatement); lexical overlap finds the sentence that names what is asked about. The
fusion runs on the client side of the core, in `Pruner.finish`, so the in-process
pruner and the Triton text model (which runs the same Pruner) give the same results.

- A sentence's lexical score: Okapi BM25 (k1 1.5, b 0.75) of the question against the
  passage's sentences, with the IDF taken from those sentences (no corpus, no language
  data), divided by the passage's best, so it lies in [0, 1].
- A passage's lexical score (for its reranking score): the share of the question's
  distinct words that occur in it, in [0, 1]; it depends on that passage alone, so a call
  cut into several requests scores exactly as the whole call.
- Fusion: (1 - w) * model + w * lexical, for the sentence probabilities and the reranking
  score alike; w = 0 leaves the model's scores untouched.

Words (`words`): Unicode word characters (`\\w+`), case-folded; Chinese, Japanese and
Korean runs as overlapping character bigrams. The settings were chosen on squad-dev and
coqa-dev (docs/quality.md)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

_WORD = re.compile(r"\w+")
#: Scripts written without spaces between words: Han (CJK ideographs and their
#: extensions and compatibility forms), Hiragana, Katakana (with its phonetic extensions
#: and half-width forms) and Hangul (syllables, jamo, compatibility jamo).
_CJK = (
    "\u1100-\u11ff\u2e80-\u2fdf\u3005-\u3007\u3021-\u3029\u3031-\u3035\u3038-\u303c"
    "\u3040-\u309f\u30a0-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff\uf900-\ufaff\uff66-\uff9f\uffa0-\uffdc"
    "\U00020000-\U0003134f"
)
_CJK_RUN = re.compile(f"[{_CJK}]+|[^{_CJK}]+")
_IS_CJK = re.compile(f"[{_CJK}]")
K1, B = 1.5, 0.75


def words(text: str) -> list[str]:
    """The words of `text`, case-folded: runs of Unicode word characters (`\\w+`); within
    them, a run of Chinese, Japanese or Korean characters becomes its overlapping character
    bigrams (a lone character stays a unigram), as Lucene's CJK analyzer indexes text that
    has no spaces between words ("東京タワー" -> 東京, 京タ, タワ, ワー)."""
    out: list[str] = []
    for token in _WORD.findall(text):
        token = token.casefold()
        if not _IS_CJK.search(token):
            out.append(token)
            continue
        for run in _CJK_RUN.findall(token):
            if not _IS_CJK.match(run):
                out.append(run)
            elif len(run) == 1:
                out.append(run)
            else:
                out.extend(run[i : i + 2] for i in range(len(run) - 1))
    return out


def sentence_scores(question: str, sentences: Sequence[str], k1: float = K1, b: float = B) -> np.ndarray:
    """Each sentence's BM25 against the question, IDF from these sentences, divided by the best."""
    docs = [words(s) for s in sentences]
    n = len(docs)
    if n == 0:
        return np.zeros(0)
    query = set(words(question))
    avgdl = sum(len(d) for d in docs) / n or 1.0
    df = Counter(w for d in docs for w in set(d) if w in query)
    idf = {w: math.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}
    out = np.zeros(n)
    for i, d in enumerate(docs):
        tf = Counter(w for w in d if w in idf)
        norm = k1 * (1 - b + b * len(d) / avgdl)
        out[i] = sum(idf[w] * f * (k1 + 1) / (f + norm) for w, f in tf.items())
    best = out.max()
    return out / best if best > 0 else out


def passage_score(question: str, passage: str) -> float:
    """The share of the question's distinct words that the passage holds."""
    query = set(words(question))
    if not query:
        return 0.0
    return len(query & set(words(passage))) / len(query)


def fuse(model: np.ndarray | float, lexical: np.ndarray | float, weight: float) -> np.ndarray | float:
    """(1 - weight) * model + weight * lexical; the model's scores as they are at weight 0."""
    if weight == 0:
        return model
    return (1.0 - weight) * model + weight * lexical
