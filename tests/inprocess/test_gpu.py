"""The in-process GPU path against the CPU path (fp32 graph: probabilities within 1e-4,
the fp16 graph within 2e-2): runs where onnxruntime-gpu and a GPU are present
(benchmarks/gpu.sh's machine), skips here with the reason."""

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
