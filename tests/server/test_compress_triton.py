"""An LLMLingua-2 compressor served by a real tritonserver (`prune repository` on its export):
the text model keeps what llmlingua's PromptCompressor keeps, and what the export keeps
in-process, over gRPC and HTTP, alone and under concurrent calls; bad input is the same
InputError; the core answers each request with its own rows."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from engine.errors import ExportError, InputError, ModelLoadError
from tests.utils import CASES, free_ports, start_serve

pytestmark = pytest.mark.server

#: what each served model is: {name: (layout, precision)}
MODELS = {"lingua_xlmr": ("xlm-roberta", "fp32"), "lingua_bert_int8": ("bert", "int8")}
#: the cases sent through the server (tests/inprocess/test_llmlingua2.py's)
SERVED = ["en-rate-force", "multi-token-force", "long-chunks", "zh", "contexts-force-ids", "target-token"]


@pytest.fixture(scope="module")
def lingua_server(lingua_exports, lingua_checkpoints, tiktoken_offline, tmp_path_factory):
    from engine.triton.server import TritonServer
    from export.triton_repository import RepositoryOptions, build_repository

    from export.onnx import export_model

    repo = tmp_path_factory.mktemp("lingua_repository")
    # the weights in a file beside the graph, as an export over protobuf's 2 GB has them
    external = tmp_path_factory.mktemp("lingua_external") / "export"
    export_model(
        lingua_checkpoints["bert"], external, precision="fp32", external_data="always", log=lambda m: None
    )
    openvino = preferring_openvino(
        lingua_exports["xlm-roberta", "fp32"], tmp_path_factory.mktemp("lingua_ov")
    )
    served = [*((n, lingua_exports[k]) for n, k in MODELS.items()), ("lingua_external", external)]
    for name, folder in [*served, ("lingua_openvino", openvino)]:
        options = RepositoryOptions(target="cpu", name=name, max_batch_size=8, max_queue_delay_us=20000)
        build_repository(folder, repo, options, log=lambda m: None)
    h, g, m = free_ports(3)
    with TritonServer(repo, http_port=h, grpc_port=g, metrics_port=m) as server:
        yield server, repo, external, openvino


def preferring_openvino(fp32, out):
    """The fp32 export as `--precision auto` writes its ov-bf16 pick: the fp32 graph, its manifest
    preferring OpenVINO bf16 (f32 where this CPU does not compute bf16: a repository names what
    the serving machine runs)."""
    import dataclasses
    import shutil

    from engine.pipeline.spec import CompressorManifest, Runtime
    from export.lingua_auto import ov_bf16_missing

    shutil.copytree(fp32, out / "export")
    manifest = CompressorManifest.read(out / "export")
    precision = "bf16" if ov_bf16_missing() is None else "fp32"
    dataclasses.replace(manifest, runtime=Runtime("openvino", precision)).write(out / "export")
    return out / "export"


@pytest.fixture(scope="module")
def in_process(lingua_exports):
    from engine.compressor import Compressor

    return {name: Compressor.load(lingua_exports[key], threads=1) for name, key in MODELS.items()}


@pytest.fixture(scope="module")
def reference(lingua_checkpoints, tiktoken_offline):
    llmlingua = pytest.importorskip("llmlingua", reason="the dev extra's llmlingua==0.2.2")
    folder = lingua_checkpoints["xlm-roberta"]
    return llmlingua.PromptCompressor(model_name=str(folder), use_llmlingua2=True, device_map="cpu")


def _connect(server, name, protocol="grpc"):
    from engine.compressor import Compressor

    url = server.grpc_url if protocol == "grpc" else server.http_url
    return Compressor.connect(url, name + "_text", protocol=protocol, timeout=60)


def test_the_served_compressor_keeps_what_llmlingua_keeps(lingua_server, reference):
    server, *_ = lingua_server
    remote = _connect(server, "lingua_xlmr")
    try:
        for case in SERVED:
            text, options = CASES[case]
            expected = reference.compress_prompt(text, return_word_label=True, **options)
            got = remote.compress(text, return_word_label=True, **options).to_dict()
            got.pop("kept_spans"), got.pop("kept_contexts")
            assert got == expected, case
    finally:
        remote.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("name", list(MODELS))
def test_the_served_compressor_equals_the_export_in_process(lingua_server, in_process, name, protocol):
    server, *_ = lingua_server
    remote = _connect(server, name, protocol)
    try:
        for case in SERVED:
            text, options = CASES[case]
            assert remote.compress(text, **options) == in_process[name].compress(text, **options), case
        assert "LLMLingua-2 on triton" in remote.describe()
    finally:
        remote.close()


def test_concurrent_calls_each_get_their_own_result(lingua_server, in_process):
    """Calls at once meet in the core's dynamic batcher (joined into one padded run for fp32):
    each is answered with its own rows, as if it ran alone."""
    server, *_ = lingua_server
    calls = [(CASES[c][0], {**CASES[c][1], "rate": r}) for c in SERVED[:4] for r in (0.3, 0.6)]
    calls = [(t, {k: v for k, v in o.items() if k != "target_token"}) for t, o in calls]
    remote = _connect(server, "lingua_xlmr")
    try:
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda c: remote.compress(c[0], **c[1]), calls))
    finally:
        remote.close()
    assert got == [in_process["lingua_xlmr"].compress(t, **o) for t, o in calls]


def test_bad_input_is_the_same_input_error_and_the_server_keeps_serving(lingua_server, in_process):
    server, *_ = lingua_server
    remote = _connect(server, "lingua_xlmr")
    try:
        for context, options in [
            ("Some text.", {"rate": 2}),
            ("Some text.", {"rates": 0.5}),
            ([], {"rate": 0.5}),
            ("   ", {"rate": 0.5}),
            ("x" * 10, {"force_tokens": "\n"}),
        ]:
            with pytest.raises(InputError) as served:
                remote.compress(context, **options)
            with pytest.raises(InputError) as local:
                in_process["lingua_xlmr"].compress(context, **options)
            assert str(served.value) == str(local.value)
        text, options = CASES["en-rate-force"]
        assert remote.compress(text, **options) == in_process["lingua_xlmr"].compress(text, **options)
    finally:
        remote.close()


def test_a_raw_kserve_call_and_the_core_model(lingua_server, in_process, lingua_exports):
    """Any KServe v2 client: the text model's JSON in and out over plain HTTP; the core answers
    token_probs for each request's own rows and width, and refuses ids past its vocabulary."""
    import tritonclient.http as th

    server, *_ = lingua_server
    client = th.InferenceServerClient(server.http_url)
    text, options = CASES["en-rate-force"]
    body = np.array([json.dumps({"context": text, **options}).encode()], dtype=np.object_)
    request = th.InferInput("request", [1], "BYTES")
    request.set_data_from_numpy(body)
    answer = json.loads(client.infer("lingua_xlmr_text", [request]).as_numpy("result")[0])
    assert answer == in_process["lingua_xlmr"].compress(text, **options).to_dict() | {
        "kept_spans": [[list(s) for s in spans] for spans in answer["kept_spans"]]
    }
    assert (
        answer["compressed_prompt"] == in_process["lingua_xlmr"].compress(text, **options).compressed_prompt
    )

    ids = np.array([[0, 100, 200, 2, 1, 1]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 1, 0, 0]], dtype=np.int64)
    inputs = [th.InferInput("input_ids", [1, 6], "INT64"), th.InferInput("attention_mask", [1, 6], "INT64")]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(mask)
    probs = client.infer("lingua_xlmr", inputs).as_numpy("token_probs")
    local = in_process["lingua_xlmr"].core.token_probs(ids, mask)
    assert probs.shape == (1, 6)
    np.testing.assert_allclose(probs[:, :4], local[:, :4], atol=1e-5)
    inputs[0].set_data_from_numpy(np.full((1, 6), 10**7, dtype=np.int64))
    with pytest.raises(Exception, match="input_ids must be within"):
        client.infer("lingua_xlmr", inputs)
    client.close()


def test_connecting_to_what_is_not_a_compressors_text_model_is_refused(lingua_server):
    from engine.compressor import Compressor

    server, *_ = lingua_server
    with pytest.raises(ModelLoadError, match="not an LLMLingua-2 compressor's text model"):
        Compressor.connect(server.grpc_url, "lingua_xlmr")


def test_the_repository_refuses_what_a_compressor_does_not_serve_on(lingua_exports, tmp_path):
    from export.triton_compressor import render_core_config
    from export.triton_repository import RepositoryOptions, build_repository

    folder = lingua_exports["bert", "fp32"]
    for options, match in [
        (RepositoryOptions(target="gpu-tensorrt"), "serves on the targets cpu, gpu-onnx"),
        (RepositoryOptions(target="cpu-openvino"), "serves on the targets"),
        (RepositoryOptions(target="gpu-onnx", runtime="openvino"), "the cpu target's python core"),
        (RepositoryOptions(inference_precision="bf16"), "bf16 is OpenVINO's"),
        (RepositoryOptions(max_batch_size=0), "max_batch_size"),
        (RepositoryOptions(name="bad name"), "use letters"),
    ]:
        with pytest.raises(ExportError, match=match):
            build_repository(folder, tmp_path / "repo", options, log=lambda m: None)
    assert not (tmp_path / "repo" / "bert").exists()
    build_repository(folder, tmp_path / "repo", RepositoryOptions(name="l"), log=lambda m: None)
    with pytest.raises(ExportError, match="exists: --overwrite"):
        build_repository(folder, tmp_path / "repo", RepositoryOptions(name="l"), log=lambda m: None)
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["l", "l_text"]
    from engine.pipeline.spec import CompressorManifest

    gpu = render_core_config(
        "l", CompressorManifest.read(folder), RepositoryOptions(target="gpu-onnx"), 0, None
    )
    assert 'platform: "onnxruntime_onnx"' in gpu and "KIND_GPU" in gpu and "join_requests" not in gpu


def test_prune_compress_on_the_server_prints_what_the_reference_keeps(
    lingua_server, reference, tmp_path, capsys
):
    """The issue's command, over Triton: `prune compress --server ... --rate 0.33 --force-tokens "\\n" "?"`,
    and a JSONL file of calls, each line's result as the export's in-process."""
    from engine.cli import main

    server, *_ = lingua_server
    text, _ = CASES["en-rate-force"]
    remote = ["compress", "--server", server.grpc_url, "--text-model", "lingua_xlmr_text"]
    assert main([*remote, "--rate", "0.33", "--force-tokens", "\\n", "?", "--text", text]) == 0
    out, err = capsys.readouterr()
    assert (
        out
        == reference.compress_prompt(text, rate=0.33, force_tokens=["\n", "?"])["compressed_prompt"] + "\n"
    )
    assert "connecting to model 'lingua_xlmr_text'" in err
    calls = tmp_path / "calls.jsonl"
    calls.write_text(
        "".join(
            json.dumps({"id": i, "context": CASES[c][0], **CASES[c][1]}) + "\n" for i, c in enumerate(SERVED)
        )
    )
    assert main([*remote, "--input", str(calls), "--output", str(tmp_path / "out.jsonl")]) == 0
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    for line, case in zip(lines, SERVED, strict=True):
        expected = reference.compress_prompt(CASES[case][0], **CASES[case][1])
        assert {k: line[k] for k in expected} == expected, case
    assert main(["compress", "--server", server.grpc_url, "--text", text]) == 2
    assert "--text-model names the compressor's text model" in capsys.readouterr().err
    assert main([*remote, "--model", "x", "--text", text]) == 2
    assert "give --model" in capsys.readouterr().err


def test_prune_serve_puts_the_http_api_in_front_of_the_compressor(lingua_server, in_process, tmp_path):
    """`prune serve` on a repository whose text model is a compressor's: its HTTP API serves POST
    /v1/compress (the pruning routes refused), answering as the export does in-process."""
    import shutil

    import httpx

    _, repo, *_ = lingua_server
    mine = tmp_path / "repo"  # the compressor alone: the API serves the repository's only text model
    for name in ("lingua_xlmr", "lingua_xlmr_text"):
        shutil.copytree(repo / name, mine / name)
    api_port = free_ports(1)[0]
    proc, lines = start_serve(mine, free_ports(3), api_port)
    try:
        assert any("/v1/compress" in line and "HTTP API ready" in line for line in lines)
        text, options = CASES["en-rate-force"]
        url = f"http://127.0.0.1:{api_port}"
        got = httpx.post(f"{url}/v1/compress", json={"context": text, **options}, timeout=60)
        assert got.status_code == 200, got.text
        expected = in_process["lingua_xlmr"].compress(text, **options).to_dict()
        assert got.json() | {"kept_spans": expected["kept_spans"]} == expected
        assert [tuple(s) for s in got.json()["kept_spans"][0]] == expected["kept_spans"][0]
        info = httpx.get(f"{url}/info", timeout=10).json()
        assert info["tokenizer"] == "sentencepiece" and "LLMLingua-2 on triton" in info["engine"]
        assert (
            httpx.post(f"{url}/v1/compress", json={"context": text, "rate": 3}, timeout=60).status_code == 422
        )
        assert (
            httpx.post(f"{url}/v1/prune", json={"question": "q", "passages": ["p"]}, timeout=10).status_code
            == 404
        )
    finally:
        proc.terminate()
        proc.wait(30)


def test_an_export_with_its_weights_beside_the_graph_is_served(lingua_server):
    """An export whose weights are external data (model.onnx.data: XLM-R large in fp32 is over
    protobuf's 2 GB) is copied whole into the repository and served as it runs in-process."""
    from engine.compressor import Compressor

    server, repo, external, _ = lingua_server
    assert (external / "model.onnx.data").is_file() and (
        repo / "lingua_external" / "1" / "model.onnx.data"
    ).is_file()
    remote = _connect(server, "lingua_external")
    local = Compressor.load(external, threads=1)
    try:
        for case in SERVED[:3]:
            text, options = CASES[case]
            assert remote.compress(text, **options) == local.compress(text, **options), case
    finally:
        remote.close()


def test_an_export_preferring_openvino_is_served_on_openvino(lingua_server):
    """`--precision auto`'s ov-bf16 pick (the fp32 graph, preferring OpenVINO bf16): the repository's
    core runs OpenVINO at that precision, as Compressor.load runs the export in-process, and keeps
    the same words."""
    from engine.compressor import Compressor

    server, repo, _, openvino = lingua_server
    config = (repo / "lingua_openvino" / "config.pbtxt").read_text()
    local = Compressor.load(openvino, threads=1)
    precision = "bf16" if "bf16 inference" in local.describe() else "f32"
    assert '"runtime"' in config and 'string_value: "openvino"' in config
    assert f'string_value: "{precision}"' in config
    remote = _connect(server, "lingua_openvino")
    try:
        for case in ("en-rate-force", "zh", "target-token"):  # one chunk each: no request joined to another
            text, options = CASES[case]
            assert remote.compress(text, **options) == local.compress(text, **options), case
    finally:
        remote.close()
