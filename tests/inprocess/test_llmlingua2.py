"""LLMLingua-2: the engine's Compressor against llmlingua 0.2.2's own PromptCompressor, run here
on tiny random-weight checkpoints of both published layouts (XLM-R SentencePiece, mBERT WordPiece):
the same compressed prompt, token counts and word labels, option by option and language by
language (texts written for these tests)."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.errors import InputError, ModelLoadError
from tests.utils import CASES, EN, JA, LONG, LONG_CJK, PT, ZH

pytestmark = pytest.mark.inprocess

LAYOUTS = ["xlm-roberta", "bert"]


@pytest.fixture(scope="module")
def pairs(lingua_checkpoints, tiktoken_offline):
    """(llmlingua's PromptCompressor, the engine's Compressor) per layout, each loaded once."""
    llmlingua = pytest.importorskip("llmlingua", reason="the dev extra's llmlingua==0.2.2")
    from engine.compressor import Compressor

    return {
        layout: (
            llmlingua.PromptCompressor(model_name=str(folder), use_llmlingua2=True, device_map="cpu"),
            Compressor.load(folder, threads=1),
        )
        for layout, folder in lingua_checkpoints.items()
    }


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_same_result_as_llmlingua(pairs, layout, case):
    reference, compressor = pairs[layout]
    text, options = CASES[case]
    expected = reference.compress_prompt(text, return_word_label=True, **options)
    got = compressor.compress(text, return_word_label=True, **options).to_dict()
    spans, kept = got.pop("kept_spans"), got.pop("kept_contexts")
    assert got == expected
    assert len(spans) == (1 if isinstance(text, str) else len(text))
    assert len(kept) == len(expected["compressed_prompt_list"]) and kept == sorted(set(kept))
    assert set(options.get("force_context_ids", ())) <= set(kept)
    assert all(not spans[i] for i in set(range(len(spans))) - set(kept))  # a dropped context: no span


def test_the_long_texts_are_several_chunks(pairs):
    from engine.pipeline.lingua_decide import CompressOptions, plan

    for _, compressor in pairs.values():
        p = plan(compressor.tokenizer, [LONG, LONG_CJK], CompressOptions(), compressor.count)
        assert all(len(chunks) >= 2 for chunks in p.chunks)
        assert max(len(c.ids) for chunks in p.chunks for c in chunks) == 512  # 511 + [CLS], [SEP] cut


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kept_spans_are_the_kept_words_in_the_original_text(pairs, layout):
    _, compressor = pairs[layout]
    for text in (
        (EN, PT, LONG, ZH) if layout == "bert" else (EN, PT, LONG)
    ):  # XLM-R's Chinese: <unk>s in words
        result = compressor.compress(text, rate=0.5, force_tokens=["\n", "?"], return_word_label=True)
        (spans,) = result.kept_spans
        kept = [w.rsplit(" ", 1) for w in result.fn_labeled_original_prompt.split("\t\t|\t\t")]
        kept = [w for w, label in kept if label == "1" and w.strip()]
        if layout == "bert":
            assert [text[a:b] for a, b in spans] == kept
        else:  # a character the tiny vocabulary lacks is <unk>, which the reference skips as a special
            # token: "In" is the word "n", a lone "0" the word "" (the span is the text's)
            held = iter(text[a:b] for a, b in spans)
            assert len(spans) >= len(kept) and all(any(w in h for h in held) for w in kept)
        assert all(a < b <= c for (a, b), (c, _) in zip(spans, spans[1:]))


def test_bad_input_is_refused_clearly(pairs, lingua_checkpoints, tmp_path):
    from engine.compressor import Compressor

    _, compressor = pairs["bert"]
    for rate in (0, 1.5, -0.2, "half"):
        with pytest.raises(InputError, match="rate must be a number in \\(0, 1\\]"):
            compressor.compress(EN, rate=rate)
    with pytest.raises(InputError, match="compress takes rate, target_token"):
        compressor.compress(EN, ratee=0.5)
    with pytest.raises(InputError, match="context must be a string"):
        compressor.compress([])
    with pytest.raises(ModelLoadError, match="no such model folder"):
        Compressor.load(tmp_path / "absent")
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"architectures": ["BertModel"]}')
    with pytest.raises(ModelLoadError, match="not an LLMLingua-2 token classifier"):
        Compressor.load(other)
    pickled = tmp_path / "pickled"
    shutil.copytree(lingua_checkpoints["bert"], pickled)
    (pickled / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no .safetensors weights"):
        Compressor.load(pickled)


def test_prune_compress_prints_what_the_reference_keeps(pairs, lingua_checkpoints, tmp_path, capsys):
    from engine.cli import main

    reference, _ = pairs["xlm-roberta"]
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(EN, encoding="utf-8")
    model = str(lingua_checkpoints["xlm-roberta"])
    args = ["compress", "--model", model, "--rate", "0.33", "--force-tokens", "\\n", "?", "--threads", "1"]
    assert main([*args, "--file", str(prompt)]) == 0
    out, err = capsys.readouterr()
    expected = reference.compress_prompt(EN, rate=0.33, force_tokens=["\n", "?"])
    assert out == expected["compressed_prompt"] + "\n"
    assert f"{expected['origin_tokens']} tokens -> {expected['compressed_tokens']}" in err
    assert main([*args, "--text", EN, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert {k: got[k] for k in expected} == expected and got["kept_spans"]
    assert main(["compress", "--model", model, "--rate", "1.5", "--text", EN]) == 2
    assert "rate must be a number in (0, 1]" in capsys.readouterr().err
    assert main(["compress", "--model", str(tmp_path / "absent"), "--text", EN]) == 2
    assert "no such model folder" in capsys.readouterr().err


def test_the_compressor_is_a_public_name():
    import engine
    from engine.compressor import Compressor
    from engine.pipeline.lingua_decide import CompressResult

    assert engine.Compressor is Compressor and engine.CompressResult is CompressResult


# ---------------------------------------------------------------------- the ONNX export (prune export)

#: the reference's cases the exports are checked on: force tokens that are and are not one token
#: (the [NEWi] rows), several chunks, several contexts, drop_consecutive
ONNX_CASES = [
    "en-rate-force",
    "multi-token-force",
    "long-chunks",
    "drop-consecutive",
    "contexts-target-token",
]


@pytest.fixture(scope="module")
def onnx_compressors(lingua_exports):
    """The exports, opened by Compressor.load: {(layout, precision): Compressor}."""
    from engine.compressor import Compressor

    return {key: Compressor.load(folder, threads=1) for key, folder in lingua_exports.items()}


@pytest.mark.parametrize("case", ONNX_CASES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_onnx_export_keeps_what_llmlingua_keeps(pairs, onnx_compressors, layout, case):
    reference, _ = pairs[layout]
    compressor = onnx_compressors[layout, "fp32"]
    assert compressor.core.name == "onnxruntime"
    text, options = CASES[case]
    expected = reference.compress_prompt(text, return_word_label=True, **options)
    got = compressor.compress(text, return_word_label=True, **options).to_dict()
    got.pop("kept_spans"), got.pop("kept_contexts")
    assert got == expected


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_export_is_a_compressor_with_llmlingua_rows(pairs, lingua_exports, onnx_compressors, layout):
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from engine.pipeline.lingua_decide import CompressOptions, plan

    folder = lingua_exports[layout, "fp32"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert (manifest["kind"], manifest["family"], manifest["layout"]) == ("compressor", "llmlingua2", layout)
    rows = onnx_compressors[layout, "fp32"].tokenizer.size  # the vocabulary with [NEW0]..[NEW99]
    assert manifest["embedding_rows"] == rows and manifest["verification"]["max_abs_diff_token_probs"] < 1e-4
    graph = onnx.load(str(folder / "model.onnx"))
    embeddings = [i for i in graph.graph.initializer if "word_embeddings" in i.name]
    assert [tuple(i.dims)[0] for i in embeddings] == [rows]
    torch_model = pairs[layout][1].core.model  # the engine's PyTorch module: llmlingua's resize, seed 42
    added = torch_model.get_input_embeddings().weight[-100:].detach().numpy()
    assert np.array_equal(
        numpy_helper.to_array(embeddings[0])[-100:], added
    )  # [NEW0]..[NEW99] as llmlingua's
    text, options = CASES["multi-token-force"]  # [NEWi] in the model's input
    p = plan(pairs[layout][1].tokenizer, [text], CompressOptions(**options), pairs[layout][1].count)
    chunks = p.chunks[0]
    assert any(i >= rows - 100 for c in chunks for i in c.ids)
    expected = np.concatenate(pairs[layout][1]._token_probs(chunks))
    assert (
        np.abs(np.concatenate(onnx_compressors[layout, "fp32"]._token_probs(chunks)) - expected).max() < 1e-4
    )
    shape = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa: E731
    assert [(i.name, shape(i)) for i in graph.graph.input] == [
        ("input_ids", ["batch", "sequence"]),
        ("attention_mask", ["batch", "sequence"]),
    ]
    assert [(o.name, shape(o)) for o in graph.graph.output] == [("token_probs", ["batch", "sequence"])]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_int8_agrees_with_fp32_past_the_gate(lingua_exports, onnx_compressors, layout):
    from engine.fidelity_check import GATE, lingua_gate

    manifest = json.loads((lingua_exports[layout, "int8"] / "manifest.json").read_text())
    assert manifest["precision"] == "int8" and manifest["quantization"]["quantized_nodes"] > 0
    assert manifest["gate"]["passed"] and manifest["gate"]["agreement"] >= GATE["agreement"]
    texts = [EN, ZH, JA, PT, LONG]  # the tests' texts, not the export's built-in ones
    report = lingua_gate(
        onnx_compressors[layout, "fp32"], onnx_compressors[layout, "int8"], texts, (0.33, 0.5)
    )
    assert report["agreement"] >= GATE["agreement"], report["reason"]
    assert report["spearman"] > 0.99 and report["words"] > 500


def test_int8_failing_the_gate_is_refused(lingua_checkpoints, tmp_path, monkeypatch):
    from engine import fidelity_check
    from engine.errors import ExportError
    from export.onnx import export_model

    monkeypatch.setitem(fidelity_check.GATE, "agreement", 1.01)  # a gate nothing passes
    notes = []
    with pytest.raises(
        ExportError, match="the int8 graph fails the fidelity gate: word agreement .*\\(>= 101%: no"
    ):
        export_model(lingua_checkpoints["bert"], tmp_path / "int8", precision="int8", log=notes.append)
    assert not (tmp_path / "int8").exists()
    assert any(n.startswith("int8: fails the gate (word agreement") for n in notes)


def test_each_door_refuses_the_other_kind(lingua_exports, lingua_checkpoints, tmp_path, capsys):
    from engine.cli import main
    from engine.compressor import Compressor
    from engine.pipeline.spec import MANIFEST_FORMAT
    from engine.pruner import Pruner

    with pytest.raises(ModelLoadError, match="an LLMLingua-2 export .*open it with Compressor.load"):
        Pruner.load(lingua_exports["bert", "fp32"], threads=1)
    pruning = tmp_path / "pruning"
    pruning.mkdir()
    (pruning / "manifest.json").write_text(json.dumps({"format": MANIFEST_FORMAT, "family": "xprovence"}))
    with pytest.raises(
        ModelLoadError, match="is a pruning export \\(family 'xprovence'\\).*open it with Pruner.load"
    ):
        Compressor.load(pruning)
    model = str(lingua_checkpoints["bert"])
    assert main(["export", "--model", model, "--out", str(tmp_path / "ov"), "--precision", "ov-int8"]) == 2
    assert "is an LLMLingua-2 checkpoint: its export is fp32, int8, fp16 or auto" in capsys.readouterr().err


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_fp16_export_is_float16_behind_the_gate_and_keeps_what_llmlingua_keeps(
    pairs, lingua_checkpoints, onnx_compressors, tmp_path, layout
):
    """`prune export --precision fp16` (the GPU's precision; the CPU runs it too): a float16 graph
    with float32 in and out, within FP16_TOLERANCE of PyTorch, and its word labels gated against
    fp32's; on the tests' texts the same result as llmlingua itself."""
    import onnx

    from engine.cli import main
    from engine.compressor import Compressor
    from engine.pipeline.spec import CompressorManifest

    out = tmp_path / "fp16"
    assert (
        main(["export", "--model", str(lingua_checkpoints[layout]), "--out", str(out), "--precision", "fp16"])
        == 0
    )
    manifest = CompressorManifest.read(out)
    assert manifest.precision == "fp16" and manifest.data["gate"]["passed"]
    assert manifest.data["gate"]["agreement"] >= 0.99 and manifest.data["fp16"]["float32_ops"]
    graph = onnx.load(str(out / "model.onnx"))
    halves = [t for t in graph.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    assert len(halves) > len(graph.graph.initializer) // 2
    assert {i.type.tensor_type.elem_type for i in graph.graph.output} == {onnx.TensorProto.FLOAT}
    fp16 = Compressor.load(out, threads=1)
    reference, _ = pairs[layout]
    for case in ("en-rate-force", "long-chunks", "contexts-target-token"):
        text, options = CASES[case]
        got = fp16.compress(text, **options).to_dict()
        got.pop("kept_spans"), got.pop("kept_contexts")
        assert got == reference.compress_prompt(text, **options), case


def test_cuda_without_onnxruntime_gpu_is_refused_with_the_fix(lingua_exports, lingua_checkpoints):
    import onnxruntime as ort

    from engine.compressor import Compressor

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: tests/inprocess/test_gpu.py runs the compressor there")
    with pytest.raises(ModelLoadError, match="device='cuda' needs ONNX Runtime's CUDA provider: pip install"):
        Compressor.load(lingua_exports["bert", "fp32"], device="cuda")
    with pytest.raises(ModelLoadError, match="device 'cuda' runs an export: prune export"):
        Compressor.load(lingua_checkpoints["bert"], device="cuda")


def test_the_api_and_run_load_a_compressor_on_the_device_asked(
    lingua_exports, checkpoints, capsys, tmp_path, monkeypatch
):
    """`prune api --model COMPRESSOR --device cuda` and `--compressor DIR --device cuda` load the
    compressor for the GPU (here, without onnxruntime-gpu, the error naming the fix), not on the
    CPU while the user asked for the GPU."""
    import onnxruntime as ort

    import engine.cli.api as api_cli
    from engine.cli import main

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: tests/inprocess/test_gpu.py runs the compressor there")

    def served(*args, **kwargs):  # loaded on the CPU after all: fail now, not serve
        raise AssertionError("the compressor was loaded and would be served")

    monkeypatch.setattr(api_cli, "api_app", served)
    export = str(lingua_exports["bert", "fp32"])
    assert main(["api", "--model", export, "--device", "cuda", "--port", "0"]) == 2
    assert "needs ONNX Runtime's CUDA provider" in capsys.readouterr().err
    question = tmp_path / "q.jsonl"
    question.write_text('{"question": "Who?", "passages": ["Alice wrote it. Bob read it."]}\n')
    argv = ["run", "--model", str(checkpoints["provence"]), "--input", str(question), "--device", "cuda"]
    assert main([*argv, "--compressor", export, "--compress-rate", "0.5"]) == 2
    assert "needs ONNX Runtime's CUDA provider" in capsys.readouterr().err


def test_loading_a_checkpoint_says_nothing_of_transformers_resize(lingua_checkpoints, capfd, caplog):
    """llmlingua's resize of the embeddings (rows drawn from the old rows' mean and covariance) is
    wanted: transformers' warning about it and its loading bar are not passed on to the user."""
    import logging

    from transformers import modeling_utils

    from engine.compressor import Compressor

    modeling_utils.logger.warning_once.cache_clear()  # a warning shown once per process: shown again
    with caplog.at_level(logging.WARNING):
        Compressor.load(lingua_checkpoints["bert"], threads=1)
    out, err = capfd.readouterr()
    assert "multivariate normal" not in caplog.text + out + err
    assert "Loading weights" not in out + err


def test_on_a_cpu_each_chunk_runs_alone_and_a_gpus_core_gets_padded_batches(onnx_compressors):
    """A CPU is busy with one sequence: each chunk runs alone at its own length (no padding); a
    core that does not say (a GPU's, Triton's) gets batches of BATCH_CHUNKS padded to their longest,
    and the words kept are the same."""
    from engine.compressor import BATCH_CHUNKS, Compressor

    cpu = onnx_compressors["xlm-roberta", "fp32"]
    shapes = []

    class Spy:
        def __init__(self, core, batch_chunks):
            self.core, self.batch_chunks = core, batch_chunks

        def token_probs(self, ids, mask):
            shapes.append((ids.shape, int(mask.sum())))
            return self.core.token_probs(ids, mask)

    text, options = CASES["long-chunks"]
    alone = Compressor(cpu.tokenizer, Spy(cpu.core, cpu.core.batch_chunks), cpu.count.encoding)
    assert cpu.core.batch_chunks == alone.batch_chunks == 1
    want = alone.compress([text, LONG_CJK], **options)
    assert len(shapes) >= 4 and all(rows == 1 and tokens == width for (rows, width), tokens in shapes)
    shapes.clear()
    batched = Compressor(cpu.tokenizer, Spy(cpu.core, None), cpu.count.encoding)
    assert batched.batch_chunks == BATCH_CHUNKS
    assert batched.compress([text, LONG_CJK], **options) == want
    assert len(shapes) == 1 and shapes[0][0][0] >= 4 and shapes[0][1] < shapes[0][0][0] * shapes[0][0][1]
