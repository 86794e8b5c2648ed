"""Triton's perf_analyzer installed apart from the engine, as docs/installing.md says (the
tritonclient 2.51 wheel with --no-deps --target, so that its protobuf<5 holds nothing back),
and `prune bench --triton --perf-analyzer PATH` running it on the bench's own server."""

import json
import subprocess
import sys

import pytest

from engine.cli import main
from engine.bench.runs import TRITON_RELEASE
from tests.utils import write_tiny_data

pytestmark = pytest.mark.packaging


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return write_tiny_data(tmp_path_factory.mktemp("tiny-data"))


@pytest.fixture(scope="module")
def perf_analyzer(tmp_path_factory):
    target = tmp_path_factory.mktemp("perf-analyzer")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            f"tritonclient=={TRITON_RELEASE}",
            "nvidia-cuda-runtime-cu12==12.9.79",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    binary = target / "bin" / "perf_analyzer"
    check = subprocess.run(
        [str(binary), "--version"],
        capture_output=True,
        text=True,
        env={"LD_LIBRARY_PATH": str(target / "nvidia" / "cuda_runtime" / "lib")},
    )
    if "libb64" in check.stderr:
        pytest.skip(
            "perf_analyzer needs Debian's libb64-0d: apt-get install libb64-0d, as root "
            "(.ci/run installs it when run as root; docs/installing.md)"
        )
    assert check.returncode == 0 and TRITON_RELEASE in check.stdout + check.stderr, (
        check.stdout + check.stderr
    )
    return binary


def test_prune_bench_runs_perf_analyzer_installed_apart(perf_analyzer, exported, tiny_data, tmp_path, capsys):
    assert (
        main(
            [
                "bench",
                "--data",
                str(tiny_data / "rag.jsonl"),
                "--model",
                str(exported["opensearch"]),
                "--triton",
                "--perf-analyzer",
                str(perf_analyzer),
                "--perf-analyzer-window",
                "1500",
                "--concurrencies",
                "1",
                "--text-instances",
                "1",
                "--queries",
                "2",
                "--repeats",
                "1",
                "--paths",
                "^triton-text-grpc-c1",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    report = json.loads(next(tmp_path.glob("bench-*/bench.json")).read_text())
    assert [r["id"] for r in report["paths"]] == ["triton-text-grpc-c1-fp32"]
    pa = report["perf_analyzer"]
    for model in ("bench", "bench_text"):
        assert list(pa[model]) == ["1"], pa[model]
        assert pa[model]["1"]["Inferences/Second"] > 0, pa[model]
    with pytest.raises(SystemExit):
        main(
            [
                "bench",
                "--data",
                str(tiny_data / "rag.jsonl"),
                "--model",
                str(exported["opensearch"]),
                "--concurrencies",
                "0",
                "--out",
                str(tmp_path),
            ]
        )
    assert "positive integers" in capsys.readouterr().err
