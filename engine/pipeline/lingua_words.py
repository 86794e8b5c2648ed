"""LLMLingua-2's text side, as llmlingua 0.2.2 does it: force tokens, chunks, model input, words.

What `PromptCompressor(use_llmlingua2=True)` does before and after its model, read from its
code (prompt_compressor.py, utils.py; ../shared/reference/llmlingua2.md), on the checkpoint's
tokenizer.json through `tokenizers` (transformers' `tokenize` and `convert_tokens_to_string` are
that file's encode and decoder: checked equal on both layouts):

- a force token the tokenizer does not make one token becomes the added special token `[NEWi]`
  (i: its place in force_tokens) in the text, and is swapped back in the words;
- the text is tokenized once and cut into chunks of at most 510 tokens, cut back to the last
  chunk-end token ("." or "\\n", or their `[NEWi]`); each chunk is made a string again and
  tokenized again, between the strings "[CLS]" and "[SEP]" (XLM-R's tokenizer makes both
  `<unk>`), truncated to 512;
- tokens become words: a word starts where the tokenizer's kind says (WordPiece: a token without
  "##"; SentencePiece: a token with "▁", a token that is a substring of ASCII punctuation, a force
  token), special tokens are skipped, and a word's probability is the mean (or the first) of its
  tokens'. The reference picks the rule by the model's *name*; the engine by the tokenizer's kind.

Nothing here runs a model: the probabilities come in, words and their spans go out.
"""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer

from engine.errors import InputError, ModelLoadError

MAX_SEQ_LEN = 512  # llmlingua's max_seq_len, hard-coded
MAX_FORCE_TOKENS = 100  # its max_force_token: [NEW0]..[NEW99] are added to the tokenizer
ADDED_TOKENS = [f"[NEW{i}]" for i in range(MAX_FORCE_TOKENS)]
_DIGIT = re.compile(r"\d")


#: the published layouts' architectures (config.json), and the layout each is
LAYOUT_OF = {"XLMRobertaForTokenClassification": "xlm-roberta", "BertForTokenClassification": "bert"}


def lingua_layout(config: dict) -> str | None:
    """The LLMLingua-2 layout ("xlm-roberta" or "bert") of a checkpoint's config.json: a
    two-label token classifier of a published architecture; None for any other model. Read
    from the config alone, no remote code."""
    archs = config.get("architectures") or []
    layout = next((LAYOUT_OF[a] for a in archs if a in LAYOUT_OF), None)
    return layout if len(config.get("id2label") or {"0": 0, "1": 1}) == 2 else None


def is_lingua_checkpoint(folder: str | Path) -> bool:
    """Whether `folder` is an LLMLingua-2 checkpoint (its config.json says so; no error)."""
    try:
        return lingua_layout(json.loads((Path(folder) / "config.json").read_text())) is not None
    except (OSError, ValueError, AttributeError):
        return False


def check_folder(folder: str | Path) -> dict:
    """The folder's config.json when it is a two-label token classifier with safetensors weights;
    ModelLoadError naming what is missing otherwise."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelLoadError(f"{folder}: no such model folder")
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{folder}: no readable config.json ({exc})") from None
    archs = config.get("architectures") or []
    if not any(a in LAYOUT_OF for a in archs):
        raise ModelLoadError(
            f"{folder}: not an LLMLingua-2 token classifier (architectures {archs}; expected "
            "XLMRobertaForTokenClassification or BertForTokenClassification)"
        )
    if lingua_layout(config) is None:
        raise ModelLoadError(
            f"{folder}: an LLMLingua-2 classifier has two labels, this one {config['id2label']}"
        )
    if not any(folder.glob("*.safetensors")):
        raise ModelLoadError(f"{folder}: no .safetensors weights (pickled weights are not loaded)")
    return config


class LinguaTokenizer:
    """A checkpoint's tokenizer with llmlingua's 100 added tokens, and its word rule."""

    def __init__(self, tokenizer: Tokenizer):
        model = json.loads(tokenizer.to_str())["model"]
        self.special = frozenset(
            t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special
        )
        tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ADDED_TOKENS])
        self.tok = tokenizer
        #: "wordpiece" (mBERT's "##" rule) or "sentencepiece" (XLM-R's "▁" rule)
        self.kind = "wordpiece" if model.get("type") == "WordPiece" else "sentencepiece"
        unk = model.get("unk_token") if isinstance(model.get("unk_token"), str) else None
        if self.kind == "sentencepiece":
            unk_id = model.get("unk_id")
            unk = tokenizer.id_to_token(unk_id) if unk_id is not None else "<unk>"
        self.unk_id = tokenizer.token_to_id(unk or "[UNK]") or 0
        #: the vocabulary with the added tokens: the model's embedding rows after llmlingua's resize
        self.size = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_folder(cls, folder: str | Path) -> "LinguaTokenizer":
        """The folder's tokenizer.json; ModelLoadError when it has none."""
        path = Path(folder) / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(
                f"{folder}: no tokenizer.json (an LLMLingua-2 checkpoint carries its tokenizer)"
            )
        return cls(Tokenizer.from_file(str(path)))

    def tokenize(self, text: str) -> tuple[list[str], list[tuple[int, int]]]:
        """transformers' `tokenize(text)`, with each token's character offsets."""
        enc = self.tok.encode(text, add_special_tokens=False)
        return enc.tokens, enc.offsets

    def to_string(self, tokens: list[str]) -> str:
        """transformers' `convert_tokens_to_string`: the tokenizer's decoder."""
        decoder = self.tok.decoder
        return decoder.decode(tokens) if decoder is not None else " ".join(tokens)

    def ids(self, tokens: list[str]) -> list[int]:
        """transformers' `convert_tokens_to_ids`: a string the vocabulary lacks is the unknown token."""
        get = self.tok.token_to_id
        return [i if (i := get(t)) is not None else self.unk_id for t in tokens]

    def is_start(self, token: str, force: set[str], mapped: set[str]) -> bool:
        """utils.is_begin_of_new_word, by the tokenizer's kind."""
        if self.kind == "wordpiece":
            # lstrip("##") strips every leading "#", as the reference's does
            return token.lstrip("#") in force or token.lstrip("#") in mapped or not token.startswith("##")
        # `token in string.punctuation` is a substring test: "()" or "./" start words too
        return token in string.punctuation or token in force or token in mapped or token.startswith("▁")

    def pure(self, token: str) -> str:
        """utils.get_pure_token: the token without its word marker."""
        return token.lstrip("#") if self.kind == "wordpiece" else token.lstrip("▁")


def force_map(tok: LinguaTokenizer, force_tokens: list[str]) -> dict[str, str]:
    """The force tokens that are not one token, each to `[NEWi]` (i: its place in the list)."""
    if len(force_tokens) > MAX_FORCE_TOKENS:
        raise InputError(f"at most {MAX_FORCE_TOKENS} force_tokens, got {len(force_tokens)}")
    return {t: ADDED_TOKENS[i] for i, t in enumerate(force_tokens) if len(tok.tokenize(t)[0]) != 1}


def replace_mapped(text: str, token_map: dict[str, str]) -> tuple[str, np.ndarray, np.ndarray]:
    """`text` with each mapped force token replaced (in the map's order, as the reference), and
    for each character of the result the original span it stands for (starts, ends)."""
    starts, ends = np.arange(len(text)), np.arange(1, len(text) + 1)
    for ori, new in token_map.items():
        if not ori or ori not in text:
            continue
        pieces, s_parts, e_parts, at = [], [], [], 0
        for m in re.finditer(re.escape(ori), text):
            pieces += [text[at : m.start()], new]
            s_parts += [starts[at : m.start()], np.full(len(new), starts[m.start()])]
            e_parts += [ends[at : m.start()], np.full(len(new), ends[m.end() - 1])]
            at = m.end()
        pieces.append(text[at:])
        s_parts.append(starts[at:])
        e_parts.append(ends[at:])
        text, starts, ends = "".join(pieces), np.concatenate(s_parts), np.concatenate(e_parts)
    return text, starts, ends


@dataclass
class Chunk:
    """One chunk of a context: its string, its first tokens' offsets, and the model's input."""

    text: str
    source_ids: list[int]  # the slice of the context's tokens it was made from
    source_offsets: list[tuple[int, int]]  # their offsets in the replaced text
    tokens: list[str] = field(default_factory=list)  # the model's input tokens, as ids read back
    ids: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)


def chunk_context(tok: LinguaTokenizer, text: str, end_tokens: set[str]) -> list[Chunk]:
    """prompt_compressor.__chunk_context, then utils.TokenClfDataset's input for each chunk."""
    enc = tok.tok.encode(text, add_special_tokens=False)
    tokens, offsets = enc.tokens, enc.offsets
    n, st, max_len, chunks = len(tokens), 0, MAX_SEQ_LEN - 2, []
    while st < n:
        if st + max_len > n - 1:
            ed = n - 1
        else:
            # the reference looks back from st + 510 (a 511th token): a chunk of 511 tokens
            # (end token at the last place, or none) loses its [SEP] to the 512 truncation
            ed = st + max_len
            for j in range(0, ed - st):
                if tokens[ed - j] in end_tokens:
                    ed = ed - j
                    break
        part = tokens[st : ed + 1]
        chunks.append(Chunk(tok.to_string(part), enc.ids[st : ed + 1], offsets[st : ed + 1]))
        st = ed + 1
    for c in chunks:
        # TokenClfDataset is built without model_name, so its specials are mBERT's strings
        # for every model ([CLS]/[SEP]/[PAD]): XLM-R's tokenizer turns them into <unk>
        words = (["[CLS]"] + tok.tokenize(c.text)[0] + ["[SEP]"])[:MAX_SEQ_LEN]
        c.ids = tok.ids(words)
        c.mask = [w != "[PAD]" for w in words]
        c.tokens = [tok.tok.id_to_token(i) for i in c.ids]
    return chunks


@dataclass
class Words:
    """A chunk's words: strings (with the tokenizer's marker, force tokens swapped back), their
    probabilities, and where they came from."""

    words: list[str]
    # float64, as the reference's under numpy 1 (what its test environment runs): its Python sum of
    # np.float32 probabilities starts from the int 0, and 0 + np.float32 is a float64 there
    probs: np.ndarray
    probs_no_force: np.ndarray
    first: np.ndarray  # each word's first and last active token (indices into the chunk's active tokens)
    last: np.ndarray


def merge_words(
    tok: LinguaTokenizer,
    chunk: Chunk,
    token_probs: np.ndarray,
    force_tokens: list[str],
    token_map: dict[str, str],
    reserve_digit: bool,
    mode: str = "mean",
) -> Words:
    """prompt_compressor.__merge_token_to_word and __token_prob_to_word_prob over a chunk's
    active tokens (`token_probs`: the model's probability of label 1 for each)."""
    active = [t for t, m in zip(chunk.tokens, chunk.mask) if m]
    probs = np.asarray(token_probs, dtype=np.float64)
    force, mapped = set(force_tokens), set(token_map.values())
    rule = {}  # each distinct token: (starts a word, a forced word start)
    for t in set(active) - tok.special:
        begin = tok.is_start(t, force, mapped)
        rule[t] = (begin, begin and (tok.pure(t) in force or tok.pure(t) in mapped))
    keep = np.array([t not in tok.special for t in active], dtype=bool)
    starts = np.array([rule.get(t, (False, False))[0] for t in active], dtype=bool)
    forced_start = np.array([rule.get(t, (False, False))[1] for t in active], dtype=bool)
    kept = np.flatnonzero(keep)
    if kept.size == 0:
        empty = np.zeros(0)
        return Words([], empty, empty, np.zeros(0, int), np.zeros(0, int))
    starts_k = starts[kept]
    starts_k[0] = True  # the reference fails (IndexError) on a first token that continues a word
    word_of = np.cumsum(starts_k) - 1
    n_words = int(word_of[-1]) + 1
    first = kept[np.flatnonzero(starts_k)]
    last = np.append(kept[np.flatnonzero(starts_k)[1:] - 1], kept[-1])
    pieces = []
    for i, is_start in zip(kept, starts_k):
        t = active[i]
        if is_start:
            for ori, new in token_map.items():  # utils.replace_added_token
                t = t.replace(new, ori)
            pieces.append(t)
        else:
            pieces.append(tok.pure(t))
    digit = np.array([reserve_digit and bool(_DIGIT.search(p if s else active[i]))
                      for p, s, i in zip(pieces, starts_k, kept)], dtype=bool)  # fmt: skip
    entry_forced = (forced_start[kept] & starts_k) | digit
    entries = np.where(entry_forced, 1.0, probs[kept])
    bounds = np.flatnonzero(starts_k)
    words = ["".join(pieces[a:b]) for a, b in zip(bounds, list(bounds[1:]) + [len(pieces)])]
    counts = np.bincount(word_of, minlength=n_words)
    if mode == "mean":
        word_probs = np.add.reduceat(entries, bounds) / counts
    elif mode == "first":
        word_probs = entries[bounds]
    else:
        raise InputError(f"token_to_word must be mean or first, got {mode!r}")
    # the reference appends the word's first probability for every later token of the word
    # (prob_no_force is set only where a word starts): its no-force word probability is the first token's
    no_force = probs[kept][bounds]
    return Words(words, word_probs, no_force, first, last)


def word_spans(
    tok: LinguaTokenizer, chunk: Chunk, words: Words, starts: np.ndarray, ends: np.ndarray, original: str
) -> list[tuple[int, int] | None]:
    """Each word's character span in the original text: by the context's own token offsets when
    the chunk's tokens are them again (the usual case), else None."""
    model_ids = [t for t, m in zip(chunk.ids, chunk.mask) if m][1:]  # [CLS]/<unk> first
    if model_ids[: len(chunk.source_ids)] != chunk.source_ids[: len(model_ids)]:
        return [None] * len(words.words)
    out: list[tuple[int, int] | None] = []
    for a, b in zip(words.first - 1, words.last - 1):
        if a < 0 or b >= len(chunk.source_offsets):
            out.append(None)
            continue
        s, e = chunk.source_offsets[a][0], chunk.source_offsets[b][1]
        if e <= s:
            out.append(None)
            continue
        s, e = int(starts[s]), int(ends[e - 1])
        while s < e and original[s].isspace():
            s += 1
        out.append((s, e) if s < e else None)
    return out
