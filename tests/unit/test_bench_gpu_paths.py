"""`prune bench`'s paths for the GPU run (#55): torch.compile on the engine's batches beside
torch batched (fp16 on a GPU), an fp16 export measured alone (no fp32 export asked for), and
torch.compile on the CPU left out with its reason unless a backend is named."""

from pathlib import Path

import pytest

from engine.cli import build_parser
from engine.bench.registry import registry, select
from engine.bench.session import BenchOptions, Session
from engine.bench.session import COMPILE_ON_CPU

pytestmark = pytest.mark.unit


def ids(paths):
    return [p.id for p in paths]


def test_the_gpu_paths_and_their_order():
    cuda = registry(
        BenchOptions({"fp16": Path("f16")}, Path("d"), checkpoint="ck", device="cuda"), "provence"
    )
    assert ids(cuda) == [
        "torch-unbatched-reference",
        "torch-batched",
        "torch-batched-fp16",
        "torch-compile-batched-fp16",
        "onnxruntime-cuda-fp16",
    ]
    assert [p.name for p in cuda][3] == "torch.compile batched fp16"
    # what gpu.sh selects: the engine's fp16 path and its two PyTorch peers on the same calls
    chosen = select(cuda, "^(onnxruntime-cuda-fp16|torch-batched-fp16|torch-compile-batched-fp16)$")
    assert ids(chosen) == ["torch-batched-fp16", "torch-compile-batched-fp16", "onnxruntime-cuda-fp16"]
    both = registry(
        BenchOptions({"fp32": Path("f32"), "fp16": Path("f16")}, Path("d"), checkpoint="ck", device="cuda"),
        "provence",
    )
    assert ids(both)[4:] == [
        "onnxruntime-cuda-fp32",
        "onnxruntime-cuda-fp32-fixed-batches-of-8-in-input-order",
        "onnxruntime-cuda-fp16",
    ]
    cpu = registry(BenchOptions({"fp16": Path("f16")}, Path("d"), checkpoint="ck"), "provence")
    assert ids(cpu) == [
        "torch-unbatched-reference",
        "torch-batched",
        "torch-compile-batched",
        "onnxruntime-fp16",
    ]
    assert BenchOptions({"fp16": Path("f16")}, Path("d")).base == "fp16"
    assert BenchOptions({"fp32": Path("a"), "fp16": Path("b")}, Path("d")).base == "fp32"
    with pytest.raises(ValueError, match="needs an fp32 .--model. or fp16 .--fp16. export"):
        BenchOptions({"int8": Path("i")}, Path("d"))
    with pytest.raises(ValueError, match="--budget-s must be positive"):
        BenchOptions({"fp32": Path("a")}, Path("d"), budget_s=0)


def test_torch_compile_on_the_cpu_says_why_it_is_left_out():
    said = []
    o = BenchOptions({"fp16": Path("f16")}, Path("d"), checkpoint="ck")
    session = Session(o, [], log=said.append)
    (compiled,) = [p for p in registry(o, "provence") if p.id == "torch-compile-batched"]
    session.starting = compiled.name
    assert compiled.start(session) is None
    assert session.reasons == {"torch.compile batched": COMPILE_ON_CPU}
    assert said == [f"torch.compile batched: not measured: {COMPILE_ON_CPU}"]
    assert "--device cuda" in COMPILE_ON_CPU and "--compile-backend" in COMPILE_ON_CPU


def test_the_flags():
    args = build_parser().parse_args(
        [
            "bench",
            "--data",
            "d.jsonl",
            "--fp16",
            "f",
            "--checkpoint",
            "ck",
            "--compile-backend",
            "aot_eager",
            "--budget-s",
            "90",
        ]
    )
    assert (args.compile_backend, args.budget_s) == ("aot_eager", 90.0)
    for bad in ("0", "-3", "soon"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", "--data", "d.jsonl", "--budget-s", bad])
