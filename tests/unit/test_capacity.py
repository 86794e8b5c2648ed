"""`prune capacity`: the queueing model against closed forms, the replica count's rules,
and the command's output as docs/scaling.md pastes it, on the committed bench run."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from engine.cli import main
from engine.errors import InputError
from engine.bench.sizing import max_utilization, mean_wait, p99_wait, path_figures, replicas_needed

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_the_mean_wait_is_m_m_1s_and_m_d_1s_by_hand():
    mu, lam = 4.0, 3.0
    rho = lam / mu
    assert mean_wait(rho, mu, 1.0) == pytest.approx(lam / (mu * (mu - lam)))  # M/M/1: Wq = rho / (mu - lam)
    assert mean_wait(rho, mu, 0.0) == pytest.approx(rho / (2 * mu * (1 - rho)))  # M/D/1: half of it
    assert mean_wait(1.0, mu, 1.0) == math.inf
    # M/M/1's waiting time: P(W > t) = rho exp(-(mu - lam) t), so its p99 is ln(100 rho) / (mu - lam)
    assert p99_wait(rho, mu, 1.0) == pytest.approx(math.log(100 * rho) / (mu - lam))


def _report(mu_c16: float = 2.0, p50: float = 300.0, p99: float = 400.0) -> dict:
    queries = 20
    return {
        "date": "d",
        "machine": {"cpu_model": "cpu", "cpus": 2},
        "settings": {"queries": queries, "passages": 400},
        "paths": [
            {
                "path": "triton-text-grpc c1 (int8)",
                "seconds_median": queries / 1.5,
                "p50_ms": p50,
                "p99_ms": p99,
            },
            {
                "path": "triton-text-grpc c16 (int8)",
                "seconds_median": queries / mu_c16,
                "p50_ms": 0,
                "p99_ms": 0,
            },
            {"path": "onnxruntime-int8", "seconds_median": 1.0, "p50_ms": 1, "p99_ms": 1},
        ],
    }


def test_replicas_grow_with_the_rate_keep_a_spare_and_meet_the_budget():
    f = path_figures(_report(), "triton-text-grpc")
    assert f["mu"] == pytest.approx(2.0) and f["s99"] == pytest.approx(0.4)
    counts = []
    for rate in (0.5, 1, 2, 5, 10, 20):
        n, p99 = replicas_needed(rate, f, 1.5)
        assert p99 <= 1.5 and n - 1 >= rate / f["mu"]
        counts.append(n)
    assert counts == sorted(counts) and counts[0] >= 2
    assert replicas_needed(1, f, 0.3) == (-1, pytest.approx(0.4))  # a budget below one query's p99
    rho = max_utilization(f, 1.5)
    assert f["s99"] + p99_wait(rho, f["mu"], f["cs2"]) == pytest.approx(1.5, abs=1e-6)
    with pytest.raises(InputError, match="no path starting with 'nope'"):
        path_figures(_report(), "nope")
    deployed = _report()  # prune bench --server names its rows without a precision
    for r in deployed["paths"]:
        r["path"] = r["path"].replace("triton-text-grpc", "deployment-text-grpc").replace(" (int8)", "")
    assert path_figures(deployed, "deployment-text-grpc")["mu"] == pytest.approx(2.0)


def test_the_command_prints_what_docs_scaling_shows(capsys, monkeypatch):
    page = (ROOT / "docs" / "scaling.md").read_text(encoding="utf-8")
    block = re.search(r"```\n\$ (prune capacity [^\n]+)\n(.*?)\n```", page, re.S)
    assert block, "docs/scaling.md shows a prune capacity run"
    args = block.group(1).split()[1:]
    monkeypatch.chdir(ROOT)
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == block.group(2).strip()


def test_a_bad_bench_file_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bench.json"
    bad.write_text("{")
    assert main(["capacity", "--bench", str(bad)]) == 2
    assert "not a readable bench.json" in capsys.readouterr().err
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_report()))
    assert main(["capacity", "--bench", str(good), "--p99", "0"]) == 2
    assert "must be positive" in capsys.readouterr().err


def test_bench_paths_have_stable_ids_and_paths_selects_by_either():
    from engine.bench.runs import path_id, selects

    assert path_id("triton-text-grpc c16 (int8)") == "triton-text-grpc-c16-int8"
    assert (
        path_id("onnxruntime-fp32, fixed batches of 8 in input order")
        == "onnxruntime-fp32-fixed-batches-of-8-in-input-order"
    )
    assert path_id(
        "peer: fastembed (ONNX Runtime int8 dynamic, per-tensor weights; embed + cosine, no decisions)"
    ).startswith("peer-fastembed-onnx-runtime-int8")
    assert selects("^triton-text-grpc-c16-int8$", "triton-text-grpc c16 (int8)")  # by id
    assert selects("text-grpc c16", "triton-text-grpc c16 (int8)")  # by name
    assert not selects("^onnxruntime-int8$", "onnxruntime-int8 in-process c4")
    assert selects(None, "anything")
