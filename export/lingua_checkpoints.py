"""Tiny random-weight LLMLingua-2 checkpoints of both published layouts.

`XLMRobertaForTokenClassification` with a SentencePiece tokenizer (as
microsoft/llmlingua-2-xlm-roberta-large-meetingbank) and `BertForTokenClassification` with a
cased WordPiece tokenizer (as microsoft/llmlingua-2-bert-base-multilingual-cased-meetingbank),
two labels, saved as config.json, model.safetensors and the tokenizer's files. The tokenizers are
trained on a small English, Chinese, Japanese and Portuguese corpus. The outputs are
MEANINGLESS: they exist so that the engine can be checked against llmlingua's own code.

llmlingua picks its word rules by substrings of the model's name ("xlm-roberta-large",
"bert-base-multilingual-cased"), so the folders are named after the published models.

`size="large"` (XLM-R only) writes the published XLM-R large layout instead, for benchmarks
(prune bench --checkpoint): 24 layers, hidden 1024, 16 heads, intermediate 4096 and the real
vocabulary size, 250,002 rows (2.2 GB of random weights). Its tokenizer is trained the same way
on `corpus` (up to 32,000 pieces: a few thousand from a few hundred paragraphs) and padded with
unused pieces to XLM-R's 250,000, which no text can produce: every id a text gets is a trained
piece, the embedding matrix has the real size.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from export.checkpoints import TINY, _load_slow_folder, _train_sentencepiece

#: the folder names: llmlingua 0.2.2 reads its word rules from these substrings of the path
LAYOUTS = {
    "xlm-roberta": "llmlingua-2-xlm-roberta-large-meetingbank-tiny",
    "bert": "llmlingua-2-bert-base-multilingual-cased-meetingbank-tiny",
}
#: the large random-weight checkpoint's folder name (the substring llmlingua reads: xlm-roberta-large)
LARGE_NAME = "llmlingua-2-xlm-roberta-large-meetingbank-random"
#: microsoft/llmlingua-2-xlm-roberta-large-meetingbank's configuration (its config.json's numbers)
LARGE = {
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "vocab_size": 250002,
}
#: the pieces of XLM-R's SentencePiece model (the tokenizer adds <pad> and <mask>: 250,002)
XLMR_PIECES = 250000

_CORPUS = """\
The meeting started at nine, and the council talked about the new bridge over the river.
Our team will ship the release next week if the tests pass and nobody finds a new bug.
She asked whether the library opens on Sunday; the clerk said it closes at 5 p.m. on weekends.
Prices rose 3.2 percent in March, while wages grew only 1.5 percent over the same months.
Please send the report before Friday, and keep a copy for the archive!
Why did the train stop? Nobody knew, so we waited, read our books and drank cold coffee.
The garden has roses, tulips and a small pond where frogs sing at night.
会议在九点开始，市议会讨论了河上的新桥。我们下周发布新版本。价格在三月上涨了百分之三。
请在星期五之前发送报告，并保留一份副本。为什么火车停了？没有人知道。花园里有玫瑰和一个小池塘。
会議は九時に始まり、市議会は川に架かる新しい橋について話し合いました。来週、新しい版を出します。
報告書を金曜日までに送ってください。なぜ電車は止まったのですか？誰も知りませんでした。庭にはバラと小さな池があります。
A reunião começou às nove, e a câmara discutiu a nova ponte sobre o rio. Vamos lançar a versão na próxima semana.
Os preços subiram 3,2 por cento em março, enquanto os salários cresceram só 1,5 por cento.
Por favor, envie o relatório antes de sexta-feira! Por que o trem parou? Ninguém sabia, então esperamos.
O jardim tem rosas, tulipas e um pequeno lago onde as rãs cantam à noite. Ação, coração, não, você, está.
"""


def _wordpiece_vocab() -> list[str]:
    """A cased WordPiece vocabulary trained on _CORPUS (tokenizers' trainer), mBERT's specials first."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=900, special_tokens=specials, show_progress=False)
    tok.train_from_iterator([line for line in _CORPUS.splitlines() if line.strip()] * 5, trainer)
    vocab = tok.get_vocab()
    return sorted(vocab, key=vocab.get)


def _padded(model: bytes, pieces: int) -> bytes:
    """The SentencePiece model `model` with unused pieces added up to `pieces`: strings of a
    private-use character no text holds, of type UNUSED (never produced), below every score."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(model)
    low = min(p.score for p in proto.pieces) - 1.0
    for i in range(pieces - len(proto.pieces)):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = f"\ue000{i:x}", low, pb.ModelProto.SentencePiece.UNUSED
    return proto.SerializeToString()


def large_tokenizer(corpus: list[str] | None):
    """The large checkpoint's XLM-R tokenizer: SentencePiece trained on `corpus` (None: _CORPUS) as
    the tiny one is, up to 32,000 pieces, padded to XLM-R's 250,000 (250,002 ids with <pad>, <mask>)."""
    text = "\n".join(corpus) if corpus else _CORPUS
    model = _train_sentencepiece(
        text, byte_fallback=False, repeat=1 if corpus else 20, vocab_size=32000,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
    )  # fmt: skip
    tok = _load_slow_folder({"sentencepiece.bpe.model": _padded(model, XLMR_PIECES)}, "XLMRobertaTokenizer")
    if len(tok) != LARGE["vocab_size"]:
        raise RuntimeError(f"the large tokenizer has {len(tok)} ids, expected {LARGE['vocab_size']}")
    return tok


def make_tokenizer(layout: str):
    """The layout's tokenizer (a transformers fast tokenizer), trained on _CORPUS."""
    if layout == "bert":
        vocab = _wordpiece_vocab()
        tok = _load_slow_folder(
            {"vocab.txt": ("\n".join(vocab) + "\n").encode()},
            "BertTokenizer",
            do_lower_case=False,
            strip_accents=False,
        )
        if len(tok) != len(vocab):
            raise RuntimeError(f"test WordPiece tokenizer has {len(tok)} tokens, expected {len(vocab)}")
        return tok
    if layout == "xlm-roberta":
        # no byte fallback, as XLM-R's own: a character the pieces lack is <unk>
        model = _train_sentencepiece(_CORPUS, byte_fallback=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
        tok = _load_slow_folder({"sentencepiece.bpe.model": model}, "XLMRobertaTokenizer")
        if len(tok) < 300 or len(tok.tokenize("the meeting started")) > 12:
            raise RuntimeError(f"test SentencePiece tokenizer is broken (vocabulary {len(tok)})")
        return tok
    raise ValueError(f"no LLMLingua-2 layout {layout!r} (xlm-roberta, bert)")


def _config(layout: str, vocab_size: int, size: dict | None = None) -> dict:
    labels = {"id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "label2id": {"LABEL_0": 0, "LABEL_1": 1}}
    common = {
        **(size or TINY),
        "vocab_size": vocab_size,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "initializer_range": 0.02,
        "position_embedding_type": "absolute",
        **labels,
    }
    if layout == "xlm-roberta":
        return {
            **common,
            "architectures": ["XLMRobertaForTokenClassification"],
            "model_type": "xlm-roberta",
            "max_position_embeddings": 514,
            "type_vocab_size": 1,
            "layer_norm_eps": 1e-5,
            "pad_token_id": 1,
            "bos_token_id": 0,
            "eos_token_id": 2,
        }
    return {
        **common,
        "architectures": ["BertForTokenClassification"],
        "model_type": "bert",
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
    }


def make_lingua_checkpoint(
    layout: str, out: str | Path, seed: int = 0, size: str = "tiny", corpus: list[str] | None = None
) -> Path:
    """Write a random-weight LLMLingua-2 checkpoint of `layout` (xlm-roberta or bert) into `out`:
    config.json, model.safetensors and the tokenizer's files. `size` "tiny" (the tests'), or
    "large" (xlm-roberta only: the published XLM-R large layout, its tokenizer trained on `corpus`)."""
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    if size not in ("tiny", "large") or (size == "large" and layout != "xlm-roberta"):
        raise ValueError(f"no {size!r} LLMLingua-2 checkpoint of layout {layout!r} (large: xlm-roberta)")
    out = Path(out)
    tok = large_tokenizer(corpus) if size == "large" else make_tokenizer(layout)
    with tempfile.TemporaryDirectory() as tmp:
        import json

        shape = LARGE if size == "large" else None
        Path(tmp, "config.json").write_text(json.dumps(_config(layout, len(tok), shape)))
        config = AutoConfig.from_pretrained(tmp)
    torch.manual_seed(seed)
    model = AutoModelForTokenClassification.from_config(config)
    with torch.no_grad():  # a wide head: keep probabilities spread over (0, 1), not all near 0.5
        gen = torch.Generator().manual_seed(seed + 1)
        head = model.classifier
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 3.0 / head.in_features**0.5)
        head.bias.zero_()
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    (out / "README.md").write_text(
        f"# Test checkpoint: LLMLingua-2 ({layout}, {size})\n\nRandom weights with the published layout.\n"
        "Its outputs are meaningless; it exists for tests, smoke runs and benchmarks.\n"
    )
    return out
