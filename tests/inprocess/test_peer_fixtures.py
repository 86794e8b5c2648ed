"""Against each family's own code: `tests/data/peer/` holds tiny checkpoints in
the families' own formats and what their original code returned on the first 20
documents of squad-dev-prune (see its README). Here: Provence (naver/bergen's
DebertaV2ForCompressionAndRanking) and XProvence (XLMRobertaForCompressionAndRanking),
their template `[CLS] q [SEP] s0 s1 ... [SEP]` with each sentence tokenized on its own:
the same token count, sentence probabilities within 1e-5 and the ranking logit within
1e-4, on the original code's own sentences. OpenProvence's `process()` decisions: below.
OpenSearch's windowed pipeline: its own test below."""

import json
from pathlib import Path

import numpy as np
import pytest

from engine.measuring import call_blocks
from engine.pruner import Pruner
from export.onnx import export_model

pytestmark = pytest.mark.inprocess

PEER = Path(__file__).resolve().parents[1] / "data" / "peer"


@pytest.mark.parametrize("family", ["provence", "xprovence"])
def test_model_math_and_template_equal_the_original_code(family, tmp_path):
    export_model(PEER / family / "checkpoint", tmp_path / family, log=lambda m: None)
    pruner = Pruner.load(tmp_path / family, threads=1)
    reference = Pruner.load(PEER / family / "checkpoint", backend="torch", threads=1)
    assert pruner.family.name == family
    docs = json.loads((PEER / family / "peer_outputs.json").read_text())
    assert len(docs) >= 19
    for doc in docs:
        sentences = [doc["peer_sentences"]]
        for engine in (pruner, reference):
            r = engine.prune(doc["question"], [doc["context"]], sentences=sentences)[0]
            assert r.blocks == 1
            spans = [[(s.start, s.end) for s in r.sentences]]
            assert len(call_blocks(engine, doc["question"], [doc["context"]], spans)[0]) == doc["n_tokens"], (
                doc["id"]
            )
            np.testing.assert_allclose(
                [s.probability for s in r.sentences], doc["probs"], atol=1e-5, rtol=0, err_msg=doc["id"]
            )
            assert r.reranking_score == pytest.approx(doc["rerank"], abs=1e-4), doc["id"]


#: text full of what normalizers treat differently: ellipsis, full-width forms, ligatures,
#: fractions, curly quotes, dashes, accents (composed and not), non-breaking and odd spaces
NASTY = (
    "Wait… the ｆｕｌｌ-width ＡＢＣ and “quotes” — ﬁ ligature ½ café cafe\u0301 "
    "no\u00a0break\u2003em space ①②③ Ⅻ ™ ﬀ ＊ ｶﾀｶﾅ 𝐛𝐨𝐥𝐝 x²"
)


@pytest.mark.parametrize("family", ["provence", "xprovence", "open_provence", "opensearch"])
def test_exported_tokenizer_tokenizes_as_the_checkpoint_does(family, tmp_path):
    """The exported tokenizer.json gives the ids the checkpoint's own tokenizer.json gives
    (as the tokenizers library, and transformers 4 that the original code ran on, load it),
    on text full of characters normalizers fold; transformers 5 rebuilds DeBERTa-v3's
    tokenizer with another normalizer, which the export must not inherit."""
    from tokenizers import Tokenizer

    export_model(
        PEER / family / "checkpoint", tmp_path / family, verify=False, optimize=False, log=lambda m: None
    )
    own = Tokenizer.from_file(str(PEER / family / "checkpoint" / "tokenizer.json"))
    exported = Tokenizer.from_file(str(tmp_path / family / "tokenizer.json"))
    for text in (NASTY, NASTY.upper(), "  leading and trailing  ", "…" * 5):
        assert (
            exported.encode(text, add_special_tokens=False).ids
            == own.encode(text, add_special_tokens=False).ids
        )
    # and the engine's own encoding of a sentence uses those ids
    pruner = Pruner.load(tmp_path / family, threads=1)
    block = call_blocks(pruner, "why?", [NASTY], [[(0, len(NASTY))]])[0]
    want = own.encode(NASTY, add_special_tokens=False).ids
    ids = list(block.input_ids)
    assert any(ids[k : k + len(want)] == want for k in range(len(ids))), (
        "the sentence's ids are not in the block"
    )


@pytest.fixture(scope="module")
def open_provence_export(tmp_path_factory) -> Path:
    """The OpenProvence fixture checkpoint exported (prune export's export_model)."""
    out = tmp_path_factory.mktemp("peer") / "open_provence"
    export_model(PEER / "open_provence" / "checkpoint", out, log=lambda m: None)
    return out


def test_open_provence_decides_as_its_process_does_in_portuguese_japanese_and_chinese(open_provence_export):
    """process() on tests/unit/test_languages.py's paragraphs (languages.json: its own splitter,
    fast-bunkai on kana text, English punkt otherwise; at its default threshold and at 0.5, as
    tests/data/peer/README.md says how it was run): `splitter="reference"` gives its sentences,
    probabilities (1e-5), kept sentences, reranking score and pruned text (apart from whitespace)."""
    pytest.importorskip("fast_bunkai", reason="the [reference-ja] extra (fast-bunkai)")
    pruner = Pruner.load(open_provence_export, threads=1)
    docs = json.loads((PEER / "open_provence" / "languages.json").read_text())
    assert sorted(d["id"][:2] for d in docs) == ["ja"] * 3 + ["pt"] * 3 + ["zh"] * 3
    for doc in docs:
        for run, options in (("default", {}), ("t05", {"threshold": 0.5})):
            peer = doc["runs"][run]
            r = pruner.prune(doc["question"], [doc["context"]], splitter="reference", **options)[0]
            assert len(r.sentences) == len(peer["probs"]), (doc["id"], run)
            np.testing.assert_allclose(
                [s.probability for s in r.sentences], peer["probs"], atol=1e-5, rtol=0, err_msg=doc["id"]
            )
            kept = {k.strip() for k in peer["kept"]}
            assert [s.kept for s in r.sentences] == [s.text in kept for s in r.sentences], (doc["id"], run)
            assert r.reranking_score == pytest.approx(peer["rerank"], abs=1e-5), (doc["id"], run)
            assert "".join(r.pruned_context.split()) == "".join(peer["pruned"].split()), (doc["id"], run)


def test_open_provence_decides_as_its_process_does(open_provence_export):
    """OpenProvenceModel.process() on the fixture documents, with its own sentences, in
    each of its runs: `default` (the config's `default_threadshold`, here null, so 0.1),
    `t05` (threshold 0.5), `noempty0` (the reranking score not forced to 0.0 when nothing is
    kept) and `strip` (stripped sentences, not forced to 0.0): the probabilities (1e-5),
    the kept sentences, the reranking score (sigmoid of the logit, best block) and the
    pruned text on every document, long sentences included: with the default
    `windows="reference"` a sentence over max_length // 2 tokens is cut into fragments
    averaged without weights, as process() does.

    process() joins its sentences, so whitespace between two sentences that its splitter
    gave to neither is missing from its pruned text, and it puts its own whitespace between
    kept sentences that are not adjacent, or none ("gravitational.In the 20th century");
    the engine keeps the passage's own whitespace: the pruned texts hold the same characters
    apart from whitespace. The same with `splitter="reference"` and no sentences given: the
    engine cuts the passages as process() does. With `windows="sentences"` (the engine's token-weighted pieces)
    the documents whose probabilities move are exactly those with such a long sentence."""
    import dataclasses

    family = "open_provence"
    pruner = Pruner.load(open_provence_export, threads=1)
    assert pruner.family.rules.windows == "reference"
    keep_zero = Pruner.load(open_provence_export, threads=1)
    keep_zero.spec = dataclasses.replace(
        keep_zero.spec, family=dataclasses.replace(keep_zero.spec.family, zero_rerank_when_empty=False)
    )
    docs = json.loads((PEER / family / "peer_outputs.json").read_text())
    assert len(docs) == 20
    half = pruner.spec.max_length // 2
    long_docs, moved, exact = set(), set(), {}
    runs = (
        ("default", pruner, "peer_sentences", {}),
        ("t05", pruner, "peer_sentences", {"threshold": 0.5}),
        ("noempty0", keep_zero, "peer_sentences", {}),
        ("strip", keep_zero, "peer_sentences_strip", {}),
        # its own sentences without being given them: its splitter (engine.pipeline.text)
        ("default", pruner, None, {"splitter": "reference"}),
        ("t05", pruner, None, {"splitter": "reference", "threshold": 0.5}),
    )
    for doc in docs:
        assert pruner.family.rules.threshold == doc["threshold_default"]
        if max(len(t) for t in pruner.encoder.tokenize(doc["peer_sentences"])) > half:
            long_docs.add(doc["id"])
        for run, engine, key, options in runs:
            peer, sentences = doc["runs"][run], doc[key or "peer_sentences"]
            given = [sentences] if key else None
            r = engine.prune(doc["question"], [doc["context"]], sentences=given, **options)[0]
            assert r.splitter == ("caller" if key else "reference")
            if not key:
                assert [s.text for s in r.sentences] == [s.strip() for s in sentences], doc["id"]
            np.testing.assert_allclose(
                [s.probability for s in r.sentences],
                peer["probs"],
                atol=1e-5,
                rtol=0,
                err_msg=f"{doc['id']} {run}",
            )
            assert [s.kept for s in r.sentences] == [s in peer["kept"] for s in sentences], (doc["id"], run)
            assert r.reranking_score == pytest.approx(peer["rerank"], abs=1e-5), (doc["id"], run)
            assert "".join(r.pruned_context.split()) == "".join(peer["pruned"].split()), (doc["id"], run)
            exact[run] = exact.get(run, 0) + (r.pruned_context == peer["pruned"])
        other = pruner.prune(
            doc["question"], [doc["context"]], sentences=[doc["peer_sentences"]], windows="sentences"
        )[0]
        if (
            np.abs(np.array([s.probability for s in other.sentences]) - doc["runs"]["default"]["probs"]).max()
            > 1e-5
        ):
            moved.add(doc["id"])
    assert long_docs and moved == long_docs
    print(
        f"\nopen_provence vs process(): {len(docs)} of {len(docs)} documents agree in every run (pruned "
        f"text identical to the character in {exact}); windows='sentences' moves the {len(long_docs)} "
        "with a sentence over max_length // 2 tokens"
    )


def test_opensearch_windows_decide_as_its_pipeline_does(tmp_path):
    """The OpenSearch pipeline (whitespace words, `is_split_into_words`, 510-token windows
    with stride 128, threshold 0.5 and backoff per window, the union kept): with the
    default `windows="reference"` the engine cuts the same windows (same sentences covered,
    same token counts), scores each within 1e-5, keeps what each window keeps, and keeps
    their union, on whole documents (`full`, 2-11 windows) and on their first three
    sentences (`short`); the same with `splitter="reference"` and no sentences given. With
    `windows="sentences"` the count of sentences whose decision changes is measured, and must be non-zero (the two really differ)."""
    family = "opensearch"
    export_model(PEER / family / "checkpoint", tmp_path / family, log=lambda m: None)
    pruner = Pruner.load(tmp_path / family, threads=1)
    assert pruner.family.rules.windows == "reference"
    from engine.pipeline.decide import keep_mask

    windows_seen, differ, total, ties = 0, 0, 0, []
    for name in ("full", "short"):
        docs = json.loads((PEER / family / f"peer_outputs_{name}.json").read_text())
        assert len(docs) >= 19
        for doc in docs:
            sentences = doc["peer_sentences"]
            r = pruner.prune(doc["question"], [doc["context"]], sentences=[sentences])[0]
            assert r.windows == "reference" and r.blocks == len(doc["windows"]), (name, doc["id"])
            spans = [[(s.start, s.end) for s in r.sentences]]
            blocks = pruner.prepare(
                doc["question"], [doc["context"]], sentences=spans, windows="reference"
            ).blocks
            outputs = pruner._run_blocks(blocks)  # each window's own outputs, as the peer's
            tied = set()
            for w, block, (_, probs) in zip(doc["windows"], blocks, outputs):
                sents = [u[0] for u in block.units]
                assert (sents[0], sents[-1], len(block)) == (w["first"], w["last"], w["len"]), (
                    name,
                    doc["id"],
                )
                np.testing.assert_allclose(
                    probs, w["probs"], atol=1e-5, rtol=0, err_msg=f"{name} {doc['id']}"
                )
                mine = keep_mask(probs, pruner.family, 0.5, "none", pruner.family.rules.alpha)
                got = {sents[k] for k in np.flatnonzero(mine)}
                # a probability within float error of the threshold may fall either side
                # (random weights put one at 0.5 - 1e-6 here, where PyTorch gave 0.5)
                for sent in got ^ set(w["preds"]):
                    k = sents.index(sent)
                    assert abs(probs[k] - 0.5) < 1e-5, (name, doc["id"], "window decision differs", sent)
                    tied.add(sent)
                windows_seen += 1
            kept = {i for i, s in enumerate(r.sentences) if s.kept}
            assert kept ^ set(doc["union"]) <= tied, (name, doc["id"])
            # the pipeline's own sentences without being given them: the same result
            own = pruner.prune(doc["question"], [doc["context"]], splitter="reference")[0]
            assert own.splitter == "reference" and own.sentences == r.sentences, (name, doc["id"])
            ties += [(doc["id"], t) for t in tied]
            if name == "full":
                other = pruner.prune(
                    doc["question"], [doc["context"]], sentences=[sentences], windows="sentences"
                )[0]
                assert other.windows == "sentences"
                differ += sum(a.kept != b.kept for a, b in zip(r.sentences, other.sentences))
                total += len(sentences)
    assert len(ties) <= 2, ties
    assert windows_seen > 60 and differ > 0
    print(
        f"\nopensearch: {windows_seen} windows as the pipeline's; decisions identical but {ties} "
        f"(probability within 1e-5 of the threshold); windows='sentences' changes {differ} of {total} "
        "sentence decisions on the full documents"
    )
