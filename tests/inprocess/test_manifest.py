"""The typed manifest (engine.pipeline.spec.Manifest): what an export writes reads back as it was,
manifests of earlier exports still load and run, and a broken one is a clear error."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.errors import ModelLoadError
from engine.pipeline.spec import Manifest

pytestmark = pytest.mark.inprocess


def test_an_exports_manifest_reads_back_as_written(exported):
    for folder in exported.values():
        written = json.loads((folder / "manifest.json").read_text())
        manifest = Manifest.read(folder)
        assert manifest.to_dict() == written  # nothing lost, nothing added
        assert manifest.family == written["family"] and manifest.buckets == tuple(written["buckets"])
        assert manifest.tokenizer.pad_id == written["tokenizer"]["pad_id"]


def test_a_manifest_from_before_the_later_keys_still_loads_and_prunes_alike(exported, pruners, tmp_path):
    """The first manifests had no defaults, buckets, inputs, embedding_rows, source,
    tokenizer file or seps_between: each has a default, and the model prunes as before."""
    from engine.pruner import Pruner

    old = tmp_path / "old"
    shutil.copytree(exported["xprovence"], old)
    now = json.loads((old / "manifest.json").read_text())
    first = {
        "format": now["format"],
        "family": "xprovence",
        "max_length": now["max_length"],
        "graph": now["graph"],
        "tokenizer": {k: now["tokenizer"][k] for k in ("cls_id", "sep_id", "pad_id")},
    }
    (old / "manifest.json").write_text(json.dumps(first))
    manifest = Manifest.read(old)
    assert manifest.buckets == () and manifest.embedding_rows == 0 and manifest.source is None
    assert manifest.tokenizer.file == "tokenizer.json" and manifest.defaults == {}
    q, docs = (
        "When was the stadium built?",
        ["The stadium was built in 1923. It holds 80,000 people.", "Paris is the capital of France."],
    )
    want = pruners["xprovence"][0].prune(q, docs, threshold=0.3)
    got = Pruner.load(old, threads=1).prune(q, docs, threshold=0.3)
    assert [r.pruned_context for r in got] == [r.pruned_context for r in want]
    assert [r.reranking_score for r in got] == pytest.approx([r.reranking_score for r in want], abs=1e-6)


def test_a_preferred_runtime_reads_back_as_written_and_goes_when_cleared(exported):
    from engine.pipeline.spec import Runtime

    m = Manifest.read(exported["opensearch"])
    assert m.runtime is None and "runtime" not in m.to_dict()
    data = m.with_changes(runtime=Runtime("openvino", "bf16")).to_dict()
    assert data["runtime"] == {"backend": "openvino", "precision": "bf16"}
    back = Manifest.from_dict(data)
    assert back.runtime == Runtime("openvino", "bf16")
    assert "runtime" not in back.with_changes(runtime=None).to_dict()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.pop("tokenizer"), "manifest lacks 'tokenizer'"),
        (lambda m: m.update(format="other/1"), "not a prune-engine/1 manifest"),
        (lambda m: m.update(max_length=8), "outside 16"),
        (lambda m: m["tokenizer"].update(pad_id=-1), "must be >= 0"),
        (lambda m: m.update(buckets=[64, 32]), "not increasing"),
        (lambda m: m["tokenizer"].pop("sep_id"), "incomplete: 'sep_id'"),
        (lambda m: m.update(family="nope"), "nope"),
        (lambda m: m.update(runtime={"backend": "tensorrt"}), "runtime must name a backend of"),
        (
            lambda m: m.update(runtime={"backend": "onnxruntime", "precision": "bf16"}),
            "onnxruntime runs at fp32, not 'bf16'",
        ),
        (lambda m: m.update(runtime="openvino"), "runtime must name a backend"),
    ],
)
def test_a_broken_manifest_is_a_clear_error(exported, change, message):
    data = json.loads((exported["opensearch"] / "manifest.json").read_text())
    change(data)
    with pytest.raises(ModelLoadError, match=message):
        Manifest.from_dict(data)
