"""The `prune` subcommands that users run, end to end on tiny data made here: eval,
fidelity, bench, run --server (text and core model), --context-file -, and their
figures checked against what they must be."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.cli import main
from engine.pruner import Pruner
from tests.utils import write_tiny_data

pytestmark = pytest.mark.server

PRUNE = Path(sys.executable).parent / "prune"


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return write_tiny_data(tmp_path_factory.mktemp("tiny-data"))


def test_eval_reports_baselines_and_the_model(exported, tiny_data, tmp_path, capsys):
    out = tmp_path / "eval"
    assert (
        main(
            [
                "eval",
                "--model",
                str(exported["opensearch"]),
                "--data",
                str(tiny_data / "prune.jsonl"),
                "--rag-data",
                str(tiny_data / "rag.jsonl"),
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    report = json.loads((out / "eval.json").read_text())
    rows = {r["name"]: r for r in report["pruning"]["rows"]}
    # keep-all by hand: 3 positives among 8 sentences -> P 3/8, R 1, F1 = 2PR/(P+R)
    p = 3 / 8
    assert rows["keep-all"]["best"]["micro"]["f1"] == pytest.approx(2 * p / (p + 1), abs=1e-9)
    assert report["pruning"]["documents"] == 3 and report["pruning"]["sentences"] == 8
    assert any(name.startswith("opensearch") for name in rows)
    metrics = report["reranking"]["metrics"]
    assert all(m["queries"] == 3 and 0 < m["mrr@10"] <= 1 for m in metrics.values())
    assert any(name.startswith("BM25") for name in metrics)
    assert (out / "eval.md").is_file() and (out / "pr_curve.png").stat().st_size > 1000
    assert "keep-all" in capsys.readouterr().out


def test_fidelity_of_fp32_is_exact(exported, tiny_data, tmp_path, capsys):
    out = tmp_path / "fid.json"
    assert (
        main(
            [
                "fidelity",
                "--model",
                str(exported["xprovence"]),
                "--data",
                str(tiny_data / "prune.jsonl"),
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    rep = json.loads(out.read_text())
    assert set(rep["decision_agreement"].values()) == {1.0}
    assert rep["max_abs_delta_prob"] < 1e-5 and rep["rerank_max_abs_error"] < 1e-4
    assert rep["pruned_text_changed_share"] == 0.0


def test_bench_without_server(exported, tiny_data, tmp_path, capsys, monkeypatch):
    assert (
        main(
            [
                "bench",
                "--data",
                str(tiny_data / "rag.jsonl"),
                "--model",
                str(exported["opensearch"]),
                "--queries",
                "2",
                "--repeats",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    report = json.loads(next(tmp_path.glob("bench-*/bench.json")).read_text())
    names = [r["path"] for r in report["paths"]]
    assert names[0] == "onnxruntime-fp32" and len(names) == 2
    assert report["settings"]["passages"] == 6
    assert all(r["passages_per_s"] > 0 and r["p50_ms"] > 0 for r in report["paths"])
    # the machine's limit: GEMM rates, and each in-process path as a share of the matching one
    gemm = report["limits"]["gemm"]
    assert gemm["fp32_gflops"] > 0 and gemm["int8_gops"] > 0
    ort = next(r for r in report["paths"] if r["path"] == "onnxruntime-fp32")
    assert 0 < ort["limit_share"] < 1.5 and ort["limit"].startswith("fp32 GEMM")
    assert "share of the limit" in next(tmp_path.glob("bench-*/bench.md")).read_text()
    assert (
        main(
            [
                "bench",
                "--data",
                str(tiny_data / "rag.jsonl"),
                "--model",
                str(exported["opensearch"]),
                "--queries",
                "1",
                "--repeats",
                "1",
                "--out",
                str(tmp_path),
                "--paths",
                "nothing-matches",
            ]
        )
        == 2
    )
    assert "--list" in capsys.readouterr().err
    # --list: the registry's paths for these flags, nothing started or measured
    runs = len(list(tmp_path.glob("bench-*")))
    assert (
        main(
            [
                "bench",
                "--list",
                "--data",
                str(tiny_data / "rag.jsonl"),
                "--model",
                str(exported["opensearch"]),
                "--triton",
                "--paths",
                "c16",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == [
        "triton-grpc-c16-fp32",
        "triton-http-c16-fp32",
        "triton-text-grpc-c16-fp32",
        "api-text-grpc-c16-fp32",
    ]
    assert len(list(tmp_path.glob("bench-*"))) == runs
    # ... nor exported: the default model's paths are listed from an empty cache, which stays empty
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    monkeypatch.setenv("PRUNE_CACHE", str(cache))
    assert main(["bench", "--list", "--data", str(tiny_data / "rag.jsonl"), "--openvino"]) == 0
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert {"onnxruntime-fp32", "onnxruntime-int8", "openvino-int8-nncf-static"} <= set(ids) and not any(
        cache.iterdir()
    )
    # on the GPU path, a missing CUDA provider is reported before any export or measurement
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        assert (
            main(
                ["bench", "--device", "cuda", "--data", str(tiny_data / "rag.jsonl"), "--out", str(tmp_path)]
            )
            == 2
        )
        assert "onnxruntime-gpu" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["opensearch_text", "opensearch"])
def test_run_against_the_server(server, pruners, model, capsys):
    doc = "The stadium was built in 1923. It holds 80,000 people.\n\n北京是中国的首都。"
    assert (
        main(
            [
                "run",
                "--server",
                server.grpc_url,
                "--text-model",
                model,
                "--question",
                "When?",
                "--context",
                doc,
                "--json",
                "--threshold",
                "0.4",
            ]
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)[0]
    exp = pruners["opensearch"][0].prune("When?", [doc], threshold=0.4)[0]
    assert got["pruned_context"] == exp.pruned_context
    assert [(s["start"], s["end"]) for s in got["sentences"]] == [(s.start, s.end) for s in exp.sentences]
    np.testing.assert_allclose(
        [s["probability"] for s in got["sentences"]], [s.probability for s in exp.sentences], atol=1e-5
    )


def test_context_from_stdin_and_negative_alpha(exported):
    doc = "Alpha one. Beta two. Gamma three."
    args = [
        str(PRUNE),
        "run",
        "--model",
        str(exported["opensearch"]),
        "--question",
        "q",
        "--context-file",
        "-",
        "--json",
        "--threshold",
        "1",
    ]
    with_backoff = json.loads(
        subprocess.run(args, input=doc, capture_output=True, text=True, check=True).stdout
    )
    without = json.loads(
        subprocess.run(args + ["--alpha", "-1"], input=doc, capture_output=True, text=True, check=True).stdout
    )
    assert with_backoff[0]["context"] == doc
    # the family's backoff (alpha 0.05) keeps the best sentence; a negative alpha disables it
    assert sum(s["kept"] for s in with_backoff[0]["sentences"]) == 1
    assert sum(s["kept"] for s in without[0]["sentences"]) == 0 and without[0]["pruned_context"] == ""


def test_core_client_with_a_given_tokenizer_and_no_text_model(checkpoints, tmp_path):
    """A repository without a text model (and an external-data graph): the core client
    takes tokenizer= (the export folder)."""
    from engine.triton.server import TritonServer
    from export.onnx import export_model
    from export.triton_repository import RepositoryOptions, build_repository
    from tests.utils import free_ports

    ext = tmp_path / "ext"
    export_model(checkpoints["xprovence"], ext, external_data="always", log=lambda m: None)
    repo = tmp_path / "repo"
    build_repository(
        ext,
        repo,
        RepositoryOptions(target="cpu", name="x", text_model=False, instances=2),
        log=lambda m: None,
    )
    assert (repo / "x" / "1" / "model.onnx.data").is_file() and not (repo / "x_text").exists()
    h, g, m = free_ports(3)
    with TritonServer(repo, http_port=h, grpc_port=g, metrics_port=m) as s:
        with pytest.raises(Exception, match="tokenizer="):
            Pruner.connect(s.grpc_url, "x")
        remote = Pruner.connect(s.grpc_url, "x", tokenizer=ext)
        docs = ["The stadium was built in 1923. It holds 80,000 people.", "Paris is in France."]
        exp = Pruner.load(ext).prune("When?", docs)
        got = remote.prune("When?", docs)
        np.testing.assert_allclose(
            [x.probability for r in got for x in r.sentences],
            [x.probability for r in exp for x in r.sentences],
            atol=1e-5,
        )
        import tritonclient.grpc as gc

        cfg = gc.InferenceServerClient(s.grpc_url).get_model_config("x").config
        assert cfg.instance_group[0].count == 2


def test_repository_command_writes_core_and_text_models(exported, tmp_path, capsys):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    out = tmp_path / "repo"
    assert (
        main(
            [
                "repository",
                "--model",
                str(exported["opensearch"]),
                "--out",
                str(out),
                "--name",
                "hl",
                "--max-batch-size",
                "8",
                "--text-instances",
                "3",
                "--text-max-passages",
                "7",
            ]
        )
        == 0
    )
    core = text_format.Parse((out / "hl" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    text = text_format.Parse((out / "hl_text" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert core.max_batch_size == 8 and core.parameters["prune_text_model"].string_value == "hl_text"
    assert text.instance_group[0].count == 3 and text.parameters["max_passages"].string_value == "7"
    assert text.parameters["core_max_batch_size"].string_value == "8"
    assert (
        main(
            [
                "repository",
                "--model",
                str(exported["opensearch"]),
                "--out",
                str(tmp_path / "r2"),
                "--no-text-model",
            ]
        )
        == 0
    )
    assert sorted(p.name for p in (tmp_path / "r2").iterdir()) == ["opensearch"]


def test_first_use_polish(exported, server, tmp_path):
    """--version, python -m engine, a closed pipe, input checked before loading, help with
    defaults, repository refusing to replace a model, the gRPC-on-HTTP-port hint."""
    import engine
    from engine.errors import BackendError, ExportError
    from export.triton_repository import RepositoryOptions, build_repository

    out = subprocess.run([str(PRUNE), "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"prune-engine {engine.__version__}"
    out = subprocess.run([sys.executable, "-m", "engine", "run", "--help"], capture_output=True, text=True)
    assert (
        out.returncode == 0
        and "PRUNE_DEVICE; default cpu)" in " ".join(out.stdout.split())
        and "(default: float32)" in out.stdout
    )
    # a missing context file is reported at once, before any model is looked at
    out = subprocess.run(
        [
            str(PRUNE),
            "run",
            "--model",
            str(tmp_path / "no-such-model"),
            "--question",
            "q",
            "--context-file",
            str(tmp_path / "missing.txt"),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "missing.txt: no such file" in out.stderr
    # `| head`: the reader closes the pipe; no traceback
    big = "A sentence about pies. " * 400
    proc = subprocess.run(
        f"'{PRUNE}' run --model '{exported['opensearch']}' --question q --json "
        f"--context '{big}' | head -c 10",
        shell=True,
        capture_output=True,
        text=True,
    )
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
    repo = tmp_path / "repo"
    build_repository(exported["opensearch"], repo, RepositoryOptions(name="m"), log=lambda m: None)
    with pytest.raises(ExportError, match="exists: --overwrite replaces it"):
        build_repository(exported["opensearch"], repo, RepositoryOptions(name="m"), log=lambda m: None)
    assert (
        main(
            [
                "repository",
                "--model",
                str(exported["opensearch"]),
                "--out",
                str(repo),
                "--name",
                "m",
                "--overwrite",
            ]
        )
        == 0
    )
    with pytest.raises(ExportError):  # a failure half-way leaves nothing behind
        build_repository(
            exported["opensearch"],
            tmp_path / "r3",
            RepositoryOptions(name="z", text_instances=0),
            log=lambda m: None,
        )
    assert not (tmp_path / "r3" / "z").exists()
    with pytest.raises(BackendError, match="it is Triton's HTTP port"):
        Pruner.connect(server.http_url, "opensearch_text", protocol="grpc", ready_timeout=1)


def test_bench_runs_the_api_beside_the_text_model_and_shares_one_pruner(
    exported, exported_int8, tiny_data, tmp_path, capsys, monkeypatch
):
    """--triton adds the HTTP API (its own process) in front of the served text model and
    in-process, at each concurrency; the in-process concurrency paths share one Pruner
    (no Pruner.load while they run)."""
    from engine.pruner import Pruner
    from engine.bench import registry as bench_module

    loads = []
    real_load = Pruner.load.__func__
    monkeypatch.setattr(
        Pruner, "load", classmethod(lambda cls, *a, **k: loads.append(a) or real_load(cls, *a, **k))
    )
    real_run = bench_module.run_concurrent
    during = []

    def counting(make_client, *args):
        before = len(loads)
        el = real_run(make_client, *args)
        during.append(len(loads) - before)
        return el

    monkeypatch.setattr(bench_module, "run_concurrent", counting)
    assert (
        main(
            [
                "bench",
                "--data",
                str(tiny_data / "rag.jsonl"),
                "--model",
                str(exported["xprovence"]),
                "--int8",
                str(exported_int8),
                "--triton",
                "--no-perf-analyzer",
                "--text-instances",
                "1",
                "--queries",
                "2",
                "--repeats",
                "1",
                "--out",
                str(tmp_path),
                "--paths",
                "text-grpc|in-process",
            ]
        )
        == 0
    )
    report = json.loads(next(tmp_path.glob("bench-*/bench.json")).read_text())
    names = {r["path"] for r in report["paths"]}
    for c in (1, 4, 16):
        assert {
            f"api-text-grpc c{c} (int8)",
            f"triton-text-grpc c{c} (int8)",
            f"onnxruntime-int8 in-process c{c}",
            f"api-in-process c{c} (int8)",
        } <= names
    assert all(r["passages_per_s"] > 0 for r in report["paths"])
    assert during and set(during) == {0}, during  # no pruner loaded per client thread
    text = next(tmp_path.glob("bench-*/bench.md")).read_text()
    assert "The HTTP API in front of the text model, against the text model over gRPC: c1:" in text
    capsys.readouterr()


def test_eval_reports_the_lexical_hybrid_beside_its_parts(exported, tiny_data, tmp_path, capsys):
    from engine.evaluate.quality import HYBRID

    out = tmp_path / "eval"
    assert (
        main(
            [
                "eval",
                "--model",
                str(exported["xprovence"]),
                "--data",
                str(tiny_data / "prune.jsonl"),
                "--rag-data",
                str(tiny_data / "rag.jsonl"),
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    report = json.loads((out / "eval.json").read_text())
    names = [r["name"] for r in report["pruning"]["rows"]]
    w = HYBRID["lexical_weight"]
    assert "BM25 over the passage's own sentences (engine.pipeline.decide)" in names
    assert any(n.endswith(f"+ lexical (weight {w})") for n in names)
    assert any(f"+ lexical (weight {w}) at threshold {HYBRID['threshold']}" in n for n in names)
    hybrid = [m for n, m in report["reranking"]["metrics"].items() if n.endswith(f"+ lexical (weight {w})")]
    assert len(hybrid) == 1 and 0 < hybrid[0]["mrr@10"] <= 1
    capsys.readouterr()


def test_bench_measures_the_peers(exported, checkpoints, tiny_data, tmp_path, capsys):
    """On the embedding family's job, the peers a user would pick (sentence-transformers,
    fastembed fp32 and int8 on the checkpoint exported plainly: embed the question and the
    sentences, take cosines) run beside the engine's paths, each with its share of the
    machine's limit; their plain exports do not outlive the run."""
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("fastembed", reason="fastembed comes with the [bench] extra")
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("prune-bench-peers-*"))
    assert (
        main(
            [
                "bench",
                "--data",
                str(tiny_data / "rag.jsonl"),
                "--model",
                str(exported["embedding"]),
                "--checkpoint",
                str(checkpoints["embedding"]),
                "--queries",
                "2",
                "--repeats",
                "1",
                "--out",
                str(tmp_path),
                "--paths",
                "peer|^onnxruntime-fp32$",
            ]
        )
        == 0
    )
    report = json.loads(next(tmp_path.glob("bench-*/bench.json")).read_text())
    rows = {r["path"]: r for r in report["paths"]}
    peers = {n: r for n, r in rows.items() if n.startswith("peer: ")}
    assert sorted(n.split(" (")[0] for n in peers) == [
        "peer: fastembed",
        "peer: fastembed",
        "peer: sentence-transformers",
    ]
    for row in [*peers.values(), rows["onnxruntime-fp32"]]:
        assert row["passages_per_s"] > 0 and 0 < row["limit_share"] < 2, row
    assert next(r for n, r in peers.items() if "int8" in n)["limit"].startswith("int8 GEMM")
    assert set(Path(tempfile.gettempdir()).glob("prune-bench-peers-*")) == before
    assert "peer" in (next(tmp_path.glob("bench-*/bench.md")).read_text())
    capsys.readouterr()


def test_run_reads_a_passages_file_and_names_what_is_wrong_with_one(exported, tmp_path, capsys):
    """`prune run --passages-file`: one passage a JSONL line (a string or an object with
    text), the same results as the passages given one by one; a bad file is named."""
    model = str(exported["embedding"])
    q = "When was the stadium built?"
    docs = ["The stadium was built in 1923. It holds 80,000 people.", "Paris is the capital of France."]
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "a", "text": docs[0]}) + "\n\n" + json.dumps(docs[1]) + "\n")
    assert main(["run", "--model", model, "--question", q, "--passages-file", str(f), "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert (
        main(["run", "--model", model, "--question", q, "--context", docs[0], "--context", docs[1], "--json"])
        == 0
    )
    assert from_file == json.loads(capsys.readouterr().out) and len(from_file) == 2
    for content, message in (
        ('{"title": "no text"}\n', "record 1: expected a JSON string"),
        ("not json\n", "line 1: not valid JSON: expecting value at column 1"),
        ("\n", "no passages"),
    ):
        f.write_text(content)
        assert main(["run", "--model", model, "--question", q, "--passages-file", str(f)]) != 0
        assert message in capsys.readouterr().err


def test_bench_measures_an_existing_deployment(exported, server, tiny_data, tmp_path, capsys):
    """--server (a Triton text model) and --api (an HTTP API) measure what is already
    running, and alone they run only the deployment's paths."""
    from engine.pruner import Pruner
    from tests.utils import serve_api

    with serve_api(Pruner.load(exported["xprovence"], threads=1)) as url:
        assert (
            main(
                [
                    "bench",
                    "--data",
                    str(tiny_data / "rag.jsonl"),
                    "--model",
                    str(exported["xprovence"]),
                    "--server",
                    server.grpc_url,
                    "--text-model",
                    "xprovence_text",
                    "--api",
                    url,
                    "--queries",
                    "2",
                    "--repeats",
                    "1",
                    "--out",
                    str(tmp_path),
                ]
            )
            == 0
        )
    report = json.loads(next(tmp_path.glob("bench-*/bench.json")).read_text())
    names = [r["path"] for r in report["paths"]]
    assert names == [f"deployment-text-grpc c{c}" for c in (1, 4, 16)] + [
        f"deployment-api c{c}" for c in (1, 4, 16)
    ]
    assert all(r["passages_per_s"] > 0 and r["p50_ms"] > 0 for r in report["paths"])
    assert report["settings"]["server"] == server.grpc_url and report["settings"]["api"] == url
    capsys.readouterr()


@pytest.mark.parametrize("data", ["squad-dev-rag.jsonl", "coqa-dev-rag.jsonl"])
def test_bench_takes_either_workload_shape(exported, data, tmp_path):
    """tests/data carries an example of each shape users have: many passages a call
    (squad-dev-rag, 20 paragraphs) and few long ones (coqa-dev-rag, 3.5 a call)."""
    from tests.utils import DATA
    from engine.datafiles import load_rag_data

    calls = load_rag_data(DATA / data)
    per_call = sum(len(c.passages) for c in calls) / len(calls)
    assert (per_call == 20) if data.startswith("squad") else (3 <= per_call <= 5)
    assert (
        main(
            [
                "bench",
                "--data",
                str(DATA / data),
                "--model",
                str(exported["opensearch"]),
                "--queries",
                "3",
                "--repeats",
                "1",
                "--paths",
                "^onnxruntime-fp32$",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    report = json.loads(next(tmp_path.glob("bench-*/bench.json")).read_text())
    assert report["settings"]["passages"] == sum(len(c.passages) for c in calls[:3])


def test_run_says_what_the_budget_cut(exported, capsys):
    """With --budget-tokens, the text output names the budget and what it cut in each passage,
    not only "nothing kept" (the sentences the rules kept, before the budget)."""
    model = str(exported["embedding"])
    q = "When was the stadium built?"
    doc = "The stadium was built in 1923. It holds 80,000 people. The roof came later, in 1970."
    assert (
        main(["run", "--model", model, "--question", q, "--context", doc, "--threshold", "0", "--json"]) == 0
    )
    kept = sum(s["kept"] for s in json.loads(capsys.readouterr().out)[0]["sentences"])
    assert kept >= 2
    assert (
        main(
            [
                "run",
                "--model",
                model,
                "--question",
                q,
                "--context",
                doc,
                "--threshold",
                "0",
                "--budget-tokens",
                "1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "budget: 1 tokens (the model's tokenizer)" in out and f"it cut {kept} sentence(s)" in out
    assert "(the budget cut what the rules kept; -v lists its sentences)" in out


def test_run_warns_once_of_text_the_model_does_not_know(exported, tmp_path, capsys):
    """Passages largely unknown to the model's vocabulary (unknown_share over the threshold; the
    test checkpoints' BERT vocabulary has no Hangul): the text output warns once per call,
    naming the multilingual models and each such passage's share; --json carries the field and
    warns on stderr; a batch file's run warns once at its end; English alone, no warning."""
    model = str(exported["embedding"])
    ko, en = (
        "서울은 한국의 수도입니다. 부산은 큰 항구 도시입니다.",
        "The stadium was built in 1923. It holds 80,000 people.",
    )
    call = [
        "run",
        "--model",
        model,
        "--question",
        "서울은 어디에 있나요?",
        "--context",
        ko,
        "--context",
        ko,
        "--context",
        en,
    ]
    assert main(call) == 0
    out = capsys.readouterr().out
    assert out.count("# warning:") == 1 and "2 of 3 passage(s) (index 0, 1) are largely unknown" in out
    assert "naver/xprovence-reranker-bgem3-v2" in out and "zilliz/semantic-highlight-bilingual-v1" in out
    assert out.count(", unknown_share ") == 2
    assert main([*call, "--json"]) == 0
    got = capsys.readouterr()
    assert [r["unknown_share"] > 0.5 for r in json.loads(got.out)] == [True, True, False]
    assert got.err.count("warning:") == 1 and "# warning" not in got.out
    lines = tmp_path / "calls.jsonl"
    lines.write_text(
        "".join(json.dumps({"question": "Where?", "passages": [p, en]}) + "\n" for p in (ko, ko))
    )
    assert (
        main(["run", "--model", model, "--input", str(lines), "--output", str(tmp_path / "out.jsonl")]) == 0
    )
    assert capsys.readouterr().err.count("warning: 2 of 4 passages are largely unknown") == 1
    assert main(["run", "--model", model, "--question", "When?", "--context", en]) == 0
    assert "warning" not in capsys.readouterr().out
