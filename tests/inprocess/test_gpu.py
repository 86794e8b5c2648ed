"""The in-process GPU path against the CPU path (fp32 graph: probabilities within 1e-4,
the fp16 graph within 2e-2): runs where onnxruntime-gpu and a GPU are present
(benchmarks/gpu.sh's machine), skips here with the reason."""

import time

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
pytestmark = [
    pytest.mark.inprocess,
    pytest.mark.skipif(
        "CUDAExecutionProvider" not in ort.get_available_providers(),
        reason=f"needs onnxruntime-gpu and a CUDA GPU (this onnxruntime has {ort.get_available_providers()})",
    ),
]

from engine.pruner import Pruner  # noqa: E402
from tests.utils import PASSAGES, QUESTION  # noqa: E402


@pytest.mark.parametrize("family", ["provence", "xprovence", "open_provence", "opensearch", "embedding"])
def test_cuda_matches_cpu(exported, family):
    cpu = Pruner.load(exported[family], threads=1)
    gpu = Pruner.load(exported[family], device="cuda")
    assert "CUDAExecutionProvider" in gpu.describe() and "IO binding" in gpu.describe()
    for a, b in zip(cpu.prune(QUESTION, PASSAGES), gpu.prune(QUESTION, PASSAGES)):
        np.testing.assert_allclose(
            [s.probability for s in a.sentences], [s.probability for s in b.sentences], atol=1e-4
        )
        assert [s.kept for s in a.sentences] == [s.kept for s in b.sentences]


def test_the_compressors_fp16_export_on_cuda_keeps_what_fp32_keeps_on_the_cpu(lingua_checkpoints, tmp_path):
    """LLMLingua-2's fp16 export on the CUDA provider, as the GPU graph (captured shapes): its word
    labels >= 99% those of the fp32 export on the CPU (the export's own gate, here on the GPU),
    on the dynamic session and in the captured CUDA graphs."""
    from engine.compressor import Compressor
    from engine.fidelity_check import GATE, lingua_gate
    from export.lingua_onnx import TEXTS
    from export.onnx import export_model

    for layout, folder in lingua_checkpoints.items():
        for precision in ("fp32", "fp16"):
            export_model(folder, tmp_path / f"{layout}-{precision}", precision=precision, log=lambda m: None)
        cpu = Compressor.load(tmp_path / f"{layout}-fp32", threads=1)
        gpu = Compressor.load(tmp_path / f"{layout}-fp16", device="cuda")
        assert "CUDAExecutionProvider" in gpu.describe() and "GPU graph" in gpu.describe()
        for _ in range(2):  # the first on the dynamic session, the second in captured CUDA graphs
            report = lingua_gate(cpu, gpu, TEXTS, (0.33, 0.5))
            assert report["agreement"] >= GATE["agreement"], (layout, report["reason"])
            while gpu.core.backend.gpu.call(lambda: len(gpu.core.backend.wanted)):
                time.sleep(0.05)  # the idle captures
        assert gpu.core.backend.shapes and "CUDA graphs on" in gpu.describe()
        gpu.close()
