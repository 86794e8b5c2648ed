"""Small random-weight checkpoints of every family, laid out exactly like the real ones.

Same config keys (custom architecture names, `auto_map`, OpenProvence's nested
`base_model_config`), same state-dict names, same tokenizer types (WordPiece for BERT,
sentencepiece for DeBERTa-v3 and XLM-R), built offline. Their outputs are MEANINGLESS:
they exist so that export, every backend and the serving path can be tested and smoke-run
without a model hub.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from engine.pipeline.families import get_family
from engine.pytorch.modeling import build_model, save_checkpoint

# A little English and Chinese text to train the tiny sentencepiece models on.
_CORPUS = """\
The quick brown fox jumps over the lazy dog. Paris is the capital and most populous city of France.
Dr. Smith paid 3.50 dollars for the book in 2020, and the U.S. economy grew 2.5 percent.
Shepherd's pie is a dish of minced meat topped with mashed potato. In early cookery books, the dish was a means of using leftover roasted meat.
What goes on the bottom of the pie? Who wrote the first novel? When was the treaty signed? How many people live in the city?
The river flows through the valley before it reaches the sea. Scientists measured the temperature of the water every hour.
The committee approved the budget on Monday, while the opposition asked for more time to read the report.
Football is played by two teams of eleven players. The stadium was built in 1923 and holds about 80,000 people.
The museum opened a new exhibition about ancient Egypt, with statues, jewels and papyrus scrolls.
Photosynthesis converts light energy into chemical energy stored in glucose. Plants release oxygen as a by-product.
中文句子。第二句！第三句？北京是中国的首都。上海是一个大城市。他说你好。我们明天去学校。
日本語の文です。東京は日本の首都です。
Le chat est sur la table. Der Hund schläft im Garten. El sol brilla en el cielo.
"""

_BERT_WORDS = sorted(set(w.strip(".,?!'\"").lower() for w in _CORPUS.split() if w.isascii()) - {""})

TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 512,
}


#: trains the tiny SentencePiece model in a process of its own: argv[1] the corpus file, argv[2]
#: the model file to write, argv[3] the special ids and other trainer options (JSON; vocab_size 800
#: unless it says, a bound: the trainer stops where the corpus runs out)
_TRAIN = """
import json, sys
import sentencepiece as spm
with open(sys.argv[2], "wb") as out:
    options = {"vocab_size": 800, **json.loads(sys.argv[3])}
    spm.SentencePieceTrainer.train(
        input=sys.argv[1], model_writer=out, model_type="unigram", character_coverage=1.0,
        hard_vocab_limit=False, minloglevel=2, seed_sentencepiece_size=100000, num_threads=1, **options)
"""


def _train_sentencepiece(corpus: str = _CORPUS, byte_fallback: bool = True, repeat: int = 20, **ids) -> bytes:
    """The tiny SentencePiece model (unigram, 800 pieces unless `ids` give a vocab_size) trained on
    `corpus` (_CORPUS; its lines `repeat` times), with these special ids (and byte fallback unless
    told not). The trainer runs in a process of its own, tried twice: in pytest's workers it was seen to
    abort the whole process (SIGABRT inside SentencePieceTrainer, twice in a hundred or so runs,
    from a file as from an iterator; never alone), which took the worker and the run with it."""
    import json
    import subprocess
    import sys

    lines = [line for line in corpus.splitlines() if line.strip()] * repeat
    with tempfile.TemporaryDirectory() as tmp:
        text, model = Path(tmp, "corpus.txt"), Path(tmp, "spm.model")
        text.write_text("\n".join(lines) + "\n", encoding="utf-8")
        for attempt in range(2):
            proc = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _TRAIN,
                    str(text),
                    str(model),
                    json.dumps({"byte_fallback": byte_fallback, **ids}),
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if proc.returncode == 0 and model.is_file():
                return model.read_bytes()
        raise RuntimeError(
            f"training the test SentencePiece model failed twice (exit {proc.returncode}): "
            f"{proc.stderr.strip()[-500:]}"
        )


def _load_slow_folder(files: dict[str, bytes], tokenizer_class: str, **options):
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            Path(tmp, name).write_bytes(data)
        Path(tmp, "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": tokenizer_class, **options})
        )
        # Loading the folder (not the class with vocab_file=) converts the sentencepiece
        # model properly; see the environment notes.
        return AutoTokenizer.from_pretrained(tmp)


def make_tokenizer(backbone: str):
    """A fast tokenizer of the backbone's real type, built offline."""
    if backbone == "bert":
        chars = sorted(
            set("abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()-$%&/") | set("中文句子北京是国的首都。！？")
        )
        vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(4)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        vocab += chars + ["##" + c for c in chars if c.isalnum()] + [w for w in _BERT_WORDS if w not in chars]
        tok = _load_slow_folder(
            {"vocab.txt": ("\n".join(vocab) + "\n").encode()}, "BertTokenizer", do_lower_case=True
        )
        if len(tok) != len(vocab):
            raise RuntimeError(f"test BERT tokenizer has {len(tok)} tokens, expected {len(vocab)}")
        return tok
    if backbone == "deberta-v2":
        model = _train_sentencepiece(
            pad_id=0,
            bos_id=1,
            eos_id=2,
            unk_id=3,
            pad_piece="[PAD]",
            bos_piece="[CLS]",
            eos_piece="[SEP]",
            unk_piece="[UNK]",
        )
        tok = _load_slow_folder({"spm.model": model}, "DebertaV2Tokenizer")
    elif backbone == "xlm-roberta":
        model = _train_sentencepiece(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
        tok = _load_slow_folder({"sentencepiece.bpe.model": model}, "XLMRobertaTokenizer")
    else:
        raise ValueError(f"no test tokenizer for backbone {backbone!r}")
    # A whitespace-only vocabulary means the sentencepiece conversion silently failed.
    if len(tok) < 300 or len(tok("the quick brown fox", add_special_tokens=False)["input_ids"]) > 12:
        raise RuntimeError(f"test tokenizer for {backbone} is broken (vocabulary {len(tok)})")
    return tok


def _provence_config(vocab_size: int) -> dict:
    return {
        "architectures": ["Provence"],
        "auto_map": {
            "AutoConfig": "modeling_provence.ProvenceConfig",
            "AutoModel": "modeling_provence.Provence",
        },
        "model_type": "Provence",
        **TINY,
        "vocab_size": vocab_size,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-7,
        "max_relative_positions": -1,
        "pad_token_id": 0,
        "position_biased_input": False,
        "relative_attention": True,
        "pos_att_type": ["p2c", "c2p"],
        "position_buckets": 256,
        "norm_rel_ebd": "layer_norm",
        "share_att_key": True,
        "type_vocab_size": 0,
        "pooler_dropout": 0,
        "pooler_hidden_act": "gelu",
        "pooler_hidden_size": TINY["hidden_size"],
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
    }


def _config(family_name: str, vocab_size: int) -> dict:
    if family_name == "provence":
        return _provence_config(vocab_size)
    roberta = {
        **TINY,
        "max_position_embeddings": 514,
        "vocab_size": vocab_size,
        "model_type": "xlm-roberta",
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "type_vocab_size": 1,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-5,
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "position_embedding_type": "absolute",
    }
    if family_name == "xprovence":
        return {
            "architectures": ["XProvence"],
            "auto_map": {"AutoModel": "modeling_xprovence.XProvence"},
            **roberta,
            "id2label": {"0": "LABEL_0"},
            "label2id": {"LABEL_0": 0},
        }
    if family_name == "xprovence-v2":
        # naver/xprovence-reranker-bgem3-v2: the hub's code is modeling_xprovence_hf.py (classes
        # XProvence, XProvenceConfig), the backbone BGE-M3's XLM-R with its 8,194 positions; the
        # weights' names are v1's (naver's training code, bergen's XLMRobertaForCompressionAndRanking)
        return {
            "_name_or_path": "naver/xprovence-reranker-bgem3-v2",
            "architectures": ["XProvence"],
            "auto_map": {"AutoModel": "modeling_xprovence_hf.XProvence"},
            **roberta,
            "max_position_embeddings": 8194,
            "id2label": {"0": "LABEL_0"},
            "label2id": {"LABEL_0": 0},
        }
    if family_name == "open_provence":
        return {
            "model_type": "open_provence",
            "architectures": ["OpenProvenceModel"],
            "auto_map": {
                "AutoConfig": "modeling_open_provence.OpenProvenceConfig",
                "AutoModel": "modeling_open_provence.OpenProvenceModel",
            },
            "base_model_config": {
                **roberta,
                "architectures": ["XLMRobertaForSequenceClassification"],
                "id2label": {"0": "LABEL_0"},
                "label2id": {"LABEL_0": 0},
            },
            "pruning_config": {
                "hidden_size": TINY["hidden_size"],
                "num_labels": 2,
                "sentence_pooling": "mean",
                "dropout": 0.1,
            },
            "max_length": 512,
            "default_threshold": 0.5,
        }
    if family_name == "embedding":
        return {
            "architectures": ["BertModel"],
            "model_type": "bert",
            **TINY,
            "vocab_size": vocab_size,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1,
            "type_vocab_size": 2,
            "initializer_range": 0.02,
            "layer_norm_eps": 1e-12,
            "pad_token_id": 0,
            "position_embedding_type": "absolute",
        }
    if family_name == "opensearch":
        return {
            "architectures": ["BertTaggerForSentenceExtractionWithBackoff"],
            "model_type": "bert",
            **TINY,
            "vocab_size": vocab_size,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1,
            "type_vocab_size": 2,
            "initializer_range": 0.02,
            "layer_norm_eps": 1e-12,
            "pad_token_id": 0,
            "position_embedding_type": "absolute",
            "id2label": {"0": "LABEL_0", "1": "LABEL_1"},
            "label2id": {"LABEL_0": 0, "LABEL_1": 1},
        }
    raise ValueError(family_name)


def _spread_heads(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Default init gives every probability ~0.5; widen the heads so that random models
    produce probabilities spread over (0, 1) and decisions at 0.1/0.3/0.5 all occur."""
    for name, module in model.named_modules():
        if (
            isinstance(module, torch.nn.Linear)
            and name.split(".")[-1] in ("classifier", "token_classifier", "out_proj")
            and "attention" not in name
        ):
            fan_in = module.in_features
            # Token heads are averaged over a sentence's tokens, which narrows the spread.
            scale = 8.0 if name in ("token_classifier", "pruning_head.classifier") else 2.5
            with torch.no_grad():
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * scale / fan_in**0.5)
                module.bias.zero_()


def _modernbert_open_provence(tok) -> dict:
    """OpenProvence on a ModernBERT backbone (as the published Japanese/English OpenProvence
    rerankers): alternating global and local (sliding-window) attention, rotary positions."""
    base = {
        "model_type": "modernbert",
        "architectures": ["ModernBertForSequenceClassification"],
        "vocab_size": len(tok),
        "hidden_size": TINY["hidden_size"],
        "intermediate_size": 48,
        "num_hidden_layers": 3,
        "num_attention_heads": TINY["num_attention_heads"],
        "max_position_embeddings": 8192,
        "global_attn_every_n_layers": 3,
        "local_attention": 32,
        "pad_token_id": tok.pad_token_id,
        "cls_token_id": tok.cls_token_id,
        "sep_token_id": tok.sep_token_id,
        "bos_token_id": tok.cls_token_id,
        "eos_token_id": tok.sep_token_id,
        "classifier_pooling": "cls",
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
    }
    return {
        "model_type": "open_provence",
        "architectures": ["OpenProvenceModel"],
        "auto_map": {
            "AutoConfig": "modeling_open_provence.OpenProvenceConfig",
            "AutoModel": "modeling_open_provence.OpenProvenceModel",
        },
        "base_model_config": base,
        "pruning_config": {
            "hidden_size": TINY["hidden_size"],
            "num_labels": 2,
            "sentence_pooling": "mean",
            "dropout": 0.1,
            "use_weighted_pooling": True,
        },
        "max_length": 512,
        "default_threshold": 0.5,
    }


def make_test_checkpoint(
    family_name: str,
    out: str | Path,
    seed: int = 0,
    sizes: dict[str, int] | None = None,
    backbone: str | None = None,
    version: str | None = None,
) -> Path:
    """Write a tiny random-weight checkpoint of `family_name` into `out`; `sizes` overrides
    the dimensions (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size:
    e.g. a Provence-size model for speed measurements, whose speed the weights do not change).
    `backbone="modernbert"` makes an OpenProvence checkpoint on ModernBERT (with a WordPiece
    tokenizer: the tokenizer type does not matter to the engine, which reads tokenizer.json).
    `version="v2"` lays an XProvence checkpoint out as naver/xprovence-reranker-bgem3-v2."""
    fam = get_family(family_name)
    out = Path(out)
    if backbone not in (None, "modernbert") or (backbone and fam.name != "open_provence"):
        raise ValueError(f"no {backbone!r} test checkpoint for {family_name} (open_provence has modernbert)")
    if version not in (None, "v2") or (version and fam.name != "xprovence"):
        raise ValueError(f"no {version!r} test checkpoint for {family_name} (xprovence has v2)")
    tok = make_tokenizer("bert" if fam.backbone == "auto" or backbone else fam.backbone)
    layout = f"{fam.name}-{version}" if version else fam.name
    config = _modernbert_open_provence(tok) if backbone else _config(layout, len(tok))
    if sizes:
        target = config.get("base_model_config", config)  # OpenProvence nests its backbone's
        target.update(sizes)
        if "pooler_hidden_size" in target:
            target["pooler_hidden_size"] = target["hidden_size"]
        if "pruning_config" in config:
            config["pruning_config"]["hidden_size"] = target["hidden_size"]
    torch.manual_seed(seed)
    model = build_model(fam, config, set(), options=None)
    gen = torch.Generator().manual_seed(seed + 1)
    _spread_heads(model, gen)
    save_checkpoint(model, out, config)
    tok.save_pretrained(str(out))
    if fam.name == "embedding":  # the sentence-transformers files of an embedding model
        (out / "modules.json").write_text(
            json.dumps(
                [
                    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                    {
                        "idx": 1,
                        "name": "1",
                        "path": "1_Pooling",
                        "type": "sentence_transformers.models.Pooling",
                    },
                    {
                        "idx": 2,
                        "name": "2",
                        "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize",
                    },
                ],
                indent=2,
            )
        )
        (out / "1_Pooling").mkdir(exist_ok=True)
        (out / "1_Pooling" / "config.json").write_text(
            json.dumps(
                {
                    "word_embedding_dimension": TINY["hidden_size"],
                    "pooling_mode_cls_token": False,
                    "pooling_mode_mean_tokens": True,
                    "pooling_mode_max_tokens": False,
                },
                indent=2,
            )
        )
    (out / "README.md").write_text(
        f"# Test checkpoint: {fam.name}\n\nRandom weights with the real layout of {fam.description}.\n"
        "Its outputs are meaningless; it exists for tests and smoke runs.\n"
    )
    return out
