"""`prune bench --checkpoint LLMLINGUA-2-CHECKPOINT` (engine/bench/lingua.py): the engine's paths
against llmlingua's PromptCompressor on prompts made of a data file's contexts, its report under the
command and the machine. Tiny checkpoint, tiny prompts, one repeat; no timing is asserted."""

from __future__ import annotations

import dataclasses

import json

import pytest

from tests.utils import DATA

pytestmark = pytest.mark.inprocess


def test_the_compressor_bench_reports_every_path(lingua_checkpoints, lingua_exports, tmp_path, capsys):
    pytest.importorskip("llmlingua", reason="the dev extra's llmlingua==0.2.2")
    from engine.cli import main

    argv = [
        "bench",
        "--checkpoint",
        str(lingua_checkpoints["xlm-roberta"]),
        "--data",
        str(DATA / "squad-dev-rag.jsonl"),
    ]
    argv += [
        "--model",
        str(lingua_exports["xlm-roberta", "fp32"]),
        "--prompt-tokens",
        "150,400",
        "--repeats",
        "1",
    ]
    argv += ["--threads", "1", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    (run,) = tmp_path.glob("bench-*")
    report = json.loads((run / "bench.json").read_text())
    assert report["command"] == "prune " + " ".join(argv) and report["date"]
    assert report["machine"]["cpus"] and "cpu_flags" in report["machine"]
    assert report["settings"]["versions"]["llmlingua"] == "0.2.2"
    assert [w["origin_tokens"] >= n for w, n in zip(report["workloads"], (150, 400))] == [True, True]
    paths = ["llmlingua PromptCompressor (reference)", "engine torch fp32", "engine onnxruntime fp32"]
    paths.append("engine onnxruntime auto")
    assert [(r["workload"], r["path"]) for r in report["rows"]] == [
        (w, p) for w in ("150 tokens", "400 tokens") for p in paths
    ]
    for r in report["rows"]:
        assert r["tokens_per_s"] > 0 and len(r["seconds"]) == 1
        # each call's seconds in the model, clocked apart: some, and never more than the call
        assert len(r["model_seconds"]) == 1 and 0 < r["model_seconds"][0] <= r["seconds"][0], r
        if r["path"] in ("engine torch fp32", "engine onnxruntime fp32"):
            assert r["identical"] is True and r["word_agreement"] == 1.0, r
    assert (
        report["auto"]["picked"] in ("fp32", "int8")
        and (run / "exports" / "auto" / "manifest.json").is_file()
    )
    assert [t["path"] for t in report["targets"]] == ["engine onnxruntime fp32"] * 2 + [
        "engine onnxruntime auto"
    ] * 2
    md = (run / "bench.md").read_text()
    assert md.startswith("# LLMLingua-2") and "prune bench --checkpoint" in md
    assert "| 150 tokens | engine onnxruntime fp32 |" in md and "| yes | 100.00% of" in md
    assert "| in the model |" in md and "%) |" in md
    assert "Targets (reported, not asserted)" in md


def test_the_compressor_bench_lists_its_paths_and_refuses_the_pruning_flags(
    lingua_checkpoints, capsys, tmp_path
):
    from engine.cli import main

    base = [
        "bench",
        "--checkpoint",
        str(lingua_checkpoints["bert"]),
        "--data",
        str(DATA / "squad-dev-rag.jsonl"),
    ]
    assert main([*base, "--list"]) == 0
    listed = capsys.readouterr().out.split("\n")
    assert [line.split()[0] for line in listed if line] == [
        "llmlingua-promptcompressor-reference",
        "engine-torch-fp32",
        "engine-onnxruntime-fp32",
        "engine-onnxruntime-auto",
    ]
    assert main([*base, "--triton", "--list"]) == 2
    assert "--triton: not for an LLMLingua-2 --checkpoint" in capsys.readouterr().err
    assert main(["bench", "--data", str(DATA / "squad-dev-rag.jsonl"), "--rate", "0.5", "--list"]) == 2
    assert "--rate: for an LLMLingua-2 --checkpoint" in capsys.readouterr().err
    # a mistyped --checkpoint is refused, not taken for the pruning benchmark's
    missing = [
        "bench",
        "--data",
        str(DATA / "squad-dev-rag.jsonl"),
        "--checkpoint",
        str(tmp_path / "missing"),
    ]
    assert main([*missing, "--rate", "0.5", "--list"]) == 2
    assert "--checkpoint" in (err := capsys.readouterr().err) and "no such folder" in err


def test_an_export_given_is_checked_before_it_is_measured(lingua_checkpoints, lingua_exports, tmp_path):
    """--model must be an fp32 export of --checkpoint: an INT8 one, or another checkpoint's, is
    not measured under the fp32 path's name (the report says why)."""
    from engine.cli import main

    def not_measured(model: str, out: str) -> str:
        argv = ["bench", "--checkpoint", str(lingua_checkpoints["xlm-roberta"])]
        argv += [
            "--data",
            str(DATA / "squad-dev-prune.jsonl"),
            "--model",
            model,
            "--paths",
            "onnxruntime-fp32",
        ]
        assert (
            main([*argv, "--prompt-tokens", "100", "--repeats", "1", "--out", str(tmp_path / out), "-q"]) == 0
        )
        (run,) = (tmp_path / out).glob("bench-*")
        report = json.loads((run / "bench.json").read_text())
        assert report["rows"] == []
        return report["not_measured"]["engine onnxruntime fp32"]

    assert "is an int8 export, not fp32" in not_measured(str(lingua_exports["xlm-roberta", "int8"]), "a")
    assert "is not an export of" in not_measured(str(lingua_exports["bert", "fp32"]), "b")


def test_the_gpu_paths_run_end_to_end_with_the_gpu_graph_on_the_cpu(
    lingua_checkpoints, tmp_path, monkeypatch
):
    """`--device cuda`'s paths, rehearsed where there is no GPU: the CUDA provider's check passed
    over, the reference's device_map "cuda" read as "cpu", and an export loaded for "cuda" given the
    CPU provider (the fp16 export on the GPU graph's own sessions, as tests/inprocess/
    test_gpu_backend.py runs them). What runs on a GPU is tests/inprocess/test_gpu.py's; this
    checks the benchmark: the fp16 export made, the GPU's paths started and compared with the
    reference, and the 10x target reported."""
    llmlingua = pytest.importorskip("llmlingua", reason="the dev extra's llmlingua==0.2.2")
    import engine.backends.onnxruntime as ort_backend
    from engine.backends.gpu_token_probs import GpuTokenProbs
    import engine.models.loading as loading
    from engine.cli import main

    monkeypatch.setattr(ort_backend, "require_cuda", lambda: None)
    made = llmlingua.PromptCompressor.__init__
    monkeypatch.setattr(
        llmlingua.PromptCompressor, "__init__", lambda self, **kw: made(self, **{**kw, "device_map": "cpu"})
    )
    load = loading.open_compressor
    loaded: list[tuple[str, str]] = []

    def on_the_cpu(folder, options, log=None):
        if not (folder / "manifest.json").is_file():  # a checkpoint: as it is
            return load(folder, options, log)
        cpu = load(folder, dataclasses.replace(options, device="cpu"), log)
        loaded.append((folder.name, options.device))
        if options.device == "cuda" and "fp16" in folder.name:
            return cpu._replace(core=GpuTokenProbs(folder / "model.onnx", device="cpu", threads=1))
        return cpu

    monkeypatch.setattr(loading, "open_compressor", on_the_cpu)
    argv = ["bench", "--checkpoint", str(lingua_checkpoints["xlm-roberta"]), "--data"]
    argv += [str(DATA / "squad-dev-rag.jsonl"), "--device", "cuda", "--prompt-tokens", "400"]
    assert main([*argv, "--repeats", "1", "--threads", "1", "--out", str(tmp_path), "--quiet"]) == 0
    (run,) = tmp_path.glob("bench-*")
    report = json.loads((run / "bench.json").read_text())
    assert sorted(loaded) == [("fp16", "cuda"), ("fp32", "cuda")]
    assert report["settings"]["device"] == "cuda" and report["not_measured"] == {}
    rows = {r["path"]: r for r in report["rows"]}
    assert list(rows) == [
        "llmlingua PromptCompressor (reference)",
        "engine onnxruntime cuda fp32",
        "engine gpu graph fp16",
    ]
    assert rows["engine onnxruntime cuda fp32"]["identical"] is True
    assert rows["engine gpu graph fp16"]["word_agreement"] >= 0.99
    assert (run / "exports" / "fp16" / "manifest.json").is_file()
    assert [t["path"] for t in report["targets"]] == ["engine gpu graph fp16"]
    assert "- engine gpu graph fp16, 400 tokens: >= 10.0x the reference" in (run / "bench.md").read_text()
