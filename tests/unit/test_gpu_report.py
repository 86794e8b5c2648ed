"""The GPU run's report (benchmarks/gpu_run/report.py) is written whatever the rows are:
the first GPU run lost its gpu.md to `KeyError: 'path'` on a skipped PyTorch row (#55).
Every shape of row the run has written, or could write, goes through markdown() and
plot(); the tables stay well-formed (every line of a table has its header's cells)."""

import json

import pytest

from benchmarks.gpu import markdown, plot
from benchmarks.gpu_run.report import label

pytestmark = pytest.mark.unit

TIMED = {
    "model": "6-layer cut",
    "path": "onnxruntime-cuda fp16",
    "batch": 16,
    "length": 512,
    "ms_per_batch": 17.2,
    "p99_ms": 18.0,
    "sequences_per_s": 930.2,
    "tokens_per_s": 476262.0,
    "tflops": 90.1,
    "share_of_fp16_peak": 0.091,
    "beside_export": True,
}
#: every row shape: measured, checked, exported, skipped and failed, old and new, and odd ones
ROWS = [
    TIMED,
    {**TIMED, "path": "torch.compile fp16", "ms_per_batch": 8.8, "compile_s": 41.5, "beside_export": False},
    {**TIMED, "path": "torch eager fp16", "batch": 1, "ms_per_batch": 12.7},
    # the first GPU run's rows (#55): a skipped PyTorch row has attn/dtype, not path
    {"attn": "eager", "dtype": "float16", "length": 512, "batch": 64, "skipped": "the budget was spent"},
    {"attn": "sdpa", "error": "DebertaV2Model does not support an attention implementation through sdpa"},
    {"attn": "eager", "dtype": "float32", "length": 128, "batch": 8, "error": "OOM"},
    {
        "attn": "eager",
        "dtype": "float32",
        "length": 128,
        "batch": 1,
        "ms_per_batch": 41.0,
        "sequences_per_s": 24.4,
        "tflops": 0.4,
        "share_of_fp16_peak": 0.0004,
        "finite": True,
    },
    {"path": "onnxruntime", "error": "ImportError: libcudnn.so.9"},
    {"path": "export fp16", "seconds": 163.0},
    {"path": "onnxruntime-cuda fp16", "skipped": "the engine's share of the budget was spent"},
    {
        "path": "onnxruntime-cuda fp16",
        "length": 512,
        "batch": 64,
        "skipped": "the engine's share of the budget was spent",
    },
    {
        "path": "onnxruntime-tensorrt fp16",
        "skipped": "TensorRT's libraries did not load: ONNX Runtime ran CUDA",
    },
    {
        "path": "onnxruntime-cuda fp32",
        "check": "vs fp32 PyTorch, batch 8",
        "max_abs_dprob": 3e-6,
        "providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    },
    {"path": "x", "max_abs_dprob": None, "providers": None},
    # the new run's rows: checkpoints, exports made, reused, stopped, failed, never started
    {"kind": "checkpoint", "model": "24 layers", "seconds": 14.2, "reused": False},
    {
        "kind": "export",
        "model": "24 layers",
        "precision": "fp16",
        "seconds": 163.0,
        "reused": False,
        "background": True,
    },
    {
        "kind": "export",
        "model": "6-layer cut",
        "precision": "fp16",
        "seconds": 0.1,
        "reused": True,
        "reused_because": "its manifest names the same checkpoint",
    },
    {
        "kind": "export",
        "model": "24 layers",
        "precision": "fp32",
        "seconds": 20.0,
        "skipped": "stopped after 20 s: the budget was spent",
    },
    {
        "kind": "export",
        "model": "24 layers",
        "precision": "fp32",
        "error": "prune export exited with 1: a | b",
    },
    {"kind": "export", "precision": "fp16", "seconds": None, "skipped": "not started: the budget was spent"},
    {"kind": "stage", "path": "prune bench", "skipped": "not reached or not finished: stopped by SIGTERM"},
    {
        "model": "24 layers",
        "path": "torch.compile fp16",
        "batch": 16,
        "length": 512,
        "skipped": "not started: the budget was spent (its compile takes about 160 s)",
    },
    {
        "model": "24 layers",
        "path": "torch.compile fp16",
        "batch": 1,
        "length": 512,
        "skipped": "torch.compile failed at an earlier shape (BackendCompilerFailed)",
    },
    {
        "model": "24 layers",
        "path": "torch.compile fp16",
        "batch": 16,
        "length": 512,
        "error": "BackendCompilerFailed:\nx",
    },
    # rows with nothing but a reason, absent or odd values
    {"skipped": "why"},
    {"error": None},
    {},
    {"path": None, "ms_per_batch": "fast", "batch": None},
    {"path": "p", "ms_per_batch": 1.0},
    {"path": "p", "ms_per_batch": 2.0, "batch": 4, "length": None, "sequences_per_s": True},
]


def tables(text: str) -> list[list[str]]:
    """The markdown tables of `text`, each its lines."""
    out, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            out.append(current)
            current = []
    return out + ([current] if current else [])


def cells(line: str) -> int:
    return len(line.strip().strip("|").split("|"))


def assert_well_formed(text: str) -> None:
    for table in tables(text):
        assert len(table) >= 3, table  # a header, its rule, a line at least
        assert set(table[1].replace("|", "")) == {"-"}, table[1]
        assert {cells(line) for line in table} == {cells(table[0])}, table


@pytest.mark.parametrize("row", ROWS, ids=range(len(ROWS)))
def test_markdown_takes_every_row_alone(row):
    report = {
        "info": {"device": "cuda", "config": "deberta-v3-large (Provence)", "budget_s": 400},
        "rows": [row],
        "command": "python -m benchmarks.gpu",
    }
    text = markdown(report)
    assert_well_formed(text)
    assert label(row) is not None
    if "skipped" in row and row.get("kind") != "export":
        assert str(row["skipped"]) in text  # what was not measured, and why
    if row.get("error") and row.get("kind") != "export":
        assert str(row["error"]).splitlines()[0] in text


def test_markdown_takes_them_all_with_the_bench_and_a_stop(tmp_path):
    report = {
        "info": {
            "device": "cuda",
            "gpu": "NVIDIA H200",
            "config": "deberta-v3-large (Provence)",
            "budget_s": 400,
            "elapsed_s": 402.5,
            "stopped": "stopped by SIGTERM after 402 s",
            "peak_tflops": 990,
            "versions": {"torch": "2.11"},
        },
        "rows": ROWS + ["not a row", None],
        "bench": {
            "status": "prune bench: exit status 0, stopped early: SIGTERM",
            "command": "prune bench ...",
            "paths": [
                {
                    "path": "onnxruntime-cuda-fp16",
                    "passages_per_s": 77.6,
                    "tokens_per_s": 42993,
                    "p50_ms": 237,
                    "repeats": 2,
                    "compile_s": None,
                },
                {"path": "torch.compile batched fp16", "passages_per_s": None},
            ],
            "not_measured": {"torch-batched-fp16": "not started: prune bench stopped (SIGTERM)"},
        },
        "command": "python -m benchmarks.gpu",
    }
    text = markdown(report)
    assert_well_formed(text)
    assert "stopped by SIGTERM" in text and "| 6-layer cut | 16 x 512 | 17.20 | - | - | 8.80 | - |" in text
    assert "| model | batch x length | onnxruntime-cuda fp16 | torch eager fp16 |" in text  # the engine first
    assert "| 24 layers | export | fp16 | 163.0 | made in the background" in text
    assert (
        "not finished: stopped after 20 s: the budget was spent" in text
        and "failed: prune export exited" in text
    )
    assert "- not measured: torch-batched-fp16: not started" in text
    json.dumps(report)  # gpu.json takes the same rows
    assert plot(report, tmp_path / "gpu.png") == (
        __import__("importlib").util.find_spec("matplotlib") is not None
    )


def test_markdown_takes_an_empty_report():
    for report in ({}, {"rows": []}, {"info": {}, "rows": None, "bench": "odd"}):
        text = markdown(report)
        assert text.startswith("# GPU benchmark") and not tables(text)
