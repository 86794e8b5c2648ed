"""Against each family's own code: `../shared/fixtures/peer/` holds tiny checkpoints in
the families' own formats and what their original code returned on the first 20
documents of squad-dev-prune (see its README). Here: Provence (naver/bergen's
DebertaV2ForCompressionAndRanking) and XProvence (XLMRobertaForCompressionAndRanking),
their template `[CLS] q [SEP] s0 s1 ... [SEP]` with each sentence tokenized on its own:
the same token count, sentence probabilities within 1e-5 and the ranking logit within
1e-4, on the original code's own sentences. (OpenProvence's `process()` and OpenSearch's
windowed pipeline differ in decisions and windowing: issue #11.)"""
import json
from pathlib import Path

import numpy as np
import pytest

from engine.pruner import Pruner
from export.onnx import export_model

PEER = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "peer"


@pytest.mark.skipif(not PEER.is_dir(), reason="../shared/fixtures is not next to this checkout")
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
            assert len(engine.encode(doc["question"], [doc["context"]], spans)[0]) == doc["n_tokens"], doc["id"]
            np.testing.assert_allclose([s.probability for s in r.sentences], doc["probs"], atol=1e-5, rtol=0,
                                       err_msg=doc["id"])
            assert r.reranking_score == pytest.approx(doc["rerank"], abs=1e-4), doc["id"]
