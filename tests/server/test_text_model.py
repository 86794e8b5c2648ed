"""The text model (`<family>_text`) on a real tritonserver: text in, pruned text out.

It runs the engine's own code on the server, so its results must equal the in-process
Pruner: the same sentences, spans, kept flags and pruned text, probabilities within 1e-5
(the same graph; only the rows the core batches together differ), reranking scores
within 1e-4.
"""

import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from engine.pipeline.encode import BatchingConfig
from engine.errors import InputError
from engine.pruner import Pruner
from engine.remote.text_pruner import TritonTextPruner
from export.triton_repository import RepositoryOptions, build_repository
from tests.utils import (
    CORE_MAX_BATCH,
    FAMILY_NAMES,
    TEXT_MAX_CHARS,
    TEXT_MAX_PASSAGES,
    load_test,
    run_in_threads,
)
from tests.utils import PASSAGES, QUESTION

pytestmark = pytest.mark.server

TOL = 1e-5
# Non-ASCII of every width: 2-byte (é), 3-byte (CJK), 4-byte (emoji, 2 UTF-16 units).
UNICODE = [
    "Crème brûlée is café food. 😀 Emoji count as one code point but four bytes! Done.",
    "北京是中国的首都。上海是一个大城市！The museum opened a new exhibition about ancient Egypt.",
]


def same(got, exp, tol=TOL):
    assert len(got) == len(exp)
    for a, b in zip(got, exp):
        assert a.index == b.index
        assert [(s.start, s.end, s.text) for s in a.sentences] == [
            (s.start, s.end, s.text) for s in b.sentences
        ]
        np.testing.assert_allclose(
            [s.probability for s in a.sentences], [s.probability for s in b.sentences], atol=tol, rtol=0
        )
        assert [s.kept for s in a.sentences] == [s.kept for s in b.sentences]
        assert a.pruned_context == b.pruned_context
        assert a.compression_rate == pytest.approx(b.compression_rate, abs=1e-6)
        assert a.blocks == b.blocks
        assert a.unknown_share == b.unknown_share  # the optional output, rounded alike
        if b.reranking_score is None:
            assert a.reranking_score is None
        else:
            assert a.reranking_score == pytest.approx(b.reranking_score, abs=1e-4)


def _splitting_threshold(results):
    """A threshold between two neighbouring probabilities (random weights leave fixed
    thresholds one-sided), so identical kept flags are a real check."""
    probs = np.sort([s.probability for r in results for s in r.sentences])
    k = int(np.argmax(np.diff(probs[len(probs) // 4 : 3 * len(probs) // 4 + 1]))) + len(probs) // 4
    return float((probs[k] + probs[k + 1]) / 2)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_text_model_equals_in_process(server, pruners, name, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    remote = Pruner.connect(url, f"{name}_text", protocol=protocol)
    assert isinstance(remote, TritonTextPruner) and remote.family.name == name
    local = pruners[name][0]
    passages = PASSAGES + UNICODE
    expected = local.prune(QUESTION, passages)
    assert max(r.blocks for r in expected) > 1  # a multi-block passage is in the set
    same(remote.prune(QUESTION, passages), expected)
    t = _splitting_threshold(expected)
    kept = local.prune(QUESTION, passages, threshold=t)
    assert 0 < sum(s.kept for r in kept for s in r.sentences) < sum(len(r.sentences) for r in kept)
    same(remote.prune(QUESTION, passages, threshold=t), kept)
    same(
        remote.prune(QUESTION, passages, threshold=t, title="first_sentence", alpha=-1, top_k=3),
        local.prune(QUESTION, passages, threshold=t, title="first_sentence", alpha=-1, top_k=3),
    )


def test_text_call_larger_than_limits_and_core_batch(server, pruners):
    """120 passages: more than the text model takes per request (50) and than the core
    takes per batch (16): the client sends 3 requests, the server splits core batches."""
    remote = Pruner.connect(server.grpc_url, "xprovence_text")
    many = [f"Passage {i}. It talks about item {i} and the pie." for i in range(120)]
    assert len(many) > TEXT_MAX_PASSAGES and len(many) > 2 * CORE_MAX_BATCH
    same(remote.prune(QUESTION, many), pruners["xprovence"][0].prune(QUESTION, many))
    big = ["A sentence about pies and their crust. " * 40] * 60  # 60 x 1,560 chars > 60,000 per request
    assert sum(map(len, big)) > TEXT_MAX_CHARS
    same(remote.prune(QUESTION, big), pruners["xprovence"][0].prune(QUESTION, big))
    with pytest.raises(InputError, match="at most"):
        remote.prune(QUESTION, ["x" * (TEXT_MAX_CHARS + 1)])


def _raw_infer(server, model, inputs):
    """A plain tritonclient gRPC call with numpy inputs {name: (array, datatype)}."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensors = []
    for name, (arr, dtype) in inputs.items():
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        tensors.append(t)
    return client.infer(model, tensors, client_timeout=30)


def _bytes(*values):
    return np.array([v if isinstance(v, bytes) else v.encode("utf-8") for v in values], dtype=np.object_)


def test_offsets_are_utf8_bytes(server, pruners):
    """sentence_spans count UTF-8 bytes of the passage as sent, for any client language."""
    res = _raw_infer(
        server,
        "provence_text",
        {"question": (_bytes(QUESTION), "BYTES"), "passages": (_bytes(*UNICODE), "BYTES")},
    )
    spans, counts = res.as_numpy("sentence_spans"), res.as_numpy("sentence_count")
    expected = pruners["provence"][0].prune(QUESTION, UNICODE)
    for row, (passage, exp) in enumerate(zip(UNICODE, expected)):
        data = passage.encode("utf-8")
        got = [data[s:e].decode("utf-8") for s, e in spans[row, : counts[row]]]
        assert got == [s.text for s in exp.sentences]
        # the units differ on this text: code point offsets would not slice the bytes
        assert [list(x) for x in spans[row, : counts[row]]] != [[s.start, s.end] for s in exp.sentences]
        assert (spans[row, counts[row] :] == -1).all()
    assert res.as_numpy("pruned_context")[0].decode("utf-8") == expected[0].pruned_context


def _readme_curl_body():
    """The JSON body of the curl command in docs/triton.md, exactly as written there."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "triton.md").read_text()
    start = readme.index("curl -s localhost:8000/v2/models/default_text/infer")
    body = readme[start : readme.index("```", start)]
    body = body[body.index("-d '") + 4 : body.rindex("'")]
    return json.loads(body.replace("'\"'\"'", "'"))


def test_curl_json_body(server, pruners):
    """The documented curl command's body, over plain HTTP (KServe v2 JSON), to a test
    model's text model: the results are the in-process engine's."""
    body = _readme_curl_body()
    question = body["inputs"][0]["data"][0]
    passages = body["inputs"][1]["data"]
    assert question.startswith("What goes on the bottom of Shepherd's pie") and len(passages) == 2
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/embedding_text/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        out = {o["name"]: o for o in json.loads(r.read())["outputs"]}
    expected = pruners["embedding"][0].prune(question, passages)
    assert out["sentence_count"]["data"] == [len(r.sentences) for r in expected]
    assert out["pruned_context"]["data"] == [r.pruned_context for r in expected]
    width = max(len(r.sentences) for r in expected)
    assert out["sentence_spans"]["shape"] == [2, width, 2]
    spans = np.array(out["sentence_spans"]["data"]).reshape(2, width, 2)
    for row, (p, r) in enumerate(zip(passages, expected)):
        data = p.encode("utf-8")
        assert [data[s:e].decode() for s, e in spans[row, : len(r.sentences)]] == [
            s.text for s in r.sentences
        ]
    np.testing.assert_allclose(
        np.array(out["sentence_probs"]["data"]).reshape(2, width)[0, :3],
        [s.probability for s in expected[0].sentences],
        atol=1e-5,
    )


def _stats(server, model):
    st = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics(model).model_stats[0]
    return st.inference_stats.success.count, st.execution_count


def test_concurrent_text_requests_meet_in_the_core_batcher(server, pruners):
    name = "xprovence"
    local = pruners[name][0]
    questions = [f"Question number {i} about the pie?" for i in range(16)]
    expected = [local.prune(q, [PASSAGES[0], PASSAGES[1]]) for q in questions]
    clients = [Pruner.connect(server.grpc_url, f"{name}_text") for _ in range(4)]
    joined = []
    # Dynamic batching joins what arrives within the queue delay (20 ms here): on a loaded
    # machine one round may see none joined, so up to three rounds, each checked.
    for _ in range(3):
        req0, exe0 = _stats(server, name)
        results = [None] * len(questions)
        barrier = threading.Barrier(len(questions))

        def work(i):
            barrier.wait()
            results[i] = clients[i % len(clients)].prune(questions[i], [PASSAGES[0], PASSAGES[1]])

        run_in_threads(work, len(questions), join_s=60)
        req1, exe1 = _stats(server, name)
        print(f"\n16 concurrent text requests: {req1 - req0} core requests in {exe1 - exe0} core executions")
        assert req1 - req0 >= len(questions)  # at least one core request per text request
        for got, exp in zip(results, expected):
            same(got, exp)
        joined.append(exe1 - exe0 < req1 - req0)  # ... joined into fewer executions
        if joined[-1]:
            break
    assert any(joined), "no round joined core requests into fewer executions"


def test_text_load_test_no_lost_or_mixed_results(server, pruners):
    """6 clients (gRPC and HTTP) for 3 seconds (bounded count too), each checking its own
    results against the in-process engine."""
    name = "opensearch"
    local = pruners[name][0]
    docs = [
        f"The stadium {i} was built in {1900 + i}. It holds {i * 1000} people. Football is played."
        for i in range(12)
    ]
    expected = {
        i: local.prune(f"When was stadium {i} built?", [docs[i], docs[(i + 1) % 12]]) for i in range(12)
    }

    def connect(k):
        proto = "grpc" if k % 2 == 0 else "http"
        return Pruner.connect(
            server.grpc_url if proto == "grpc" else server.http_url, f"{name}_text", protocol=proto
        )

    def call(p, k, n):
        i = (k * 5 + n) % 12
        same(p.prune(f"When was stadium {i} built?", [docs[i], docs[(i + 1) % 12]]), expected[i])
        return i

    done, errors = load_test(connect, call, clients=6)
    assert not errors, errors[:3]
    assert len(done) >= 12


BAD = {
    "invalid UTF-8 in a passage": (
        {"question": (_bytes(QUESTION), "BYTES"), "passages": (_bytes("fine.", b"\xff\xfe broken"), "BYTES")},
        "not valid UTF-8",
    ),
    "invalid UTF-8 in the question": (
        {"question": (_bytes(b"\xc3("), "BYTES"), "passages": (_bytes("fine."), "BYTES")},
        "question is not valid UTF-8",
    ),
    "empty question": (
        {"question": (_bytes("  "), "BYTES"), "passages": (_bytes("fine."), "BYTES")},
        "question is empty",
    ),
    "too many passages": (
        {
            "question": (_bytes(QUESTION), "BYTES"),
            "passages": (_bytes(*["p."] * (TEXT_MAX_PASSAGES + 1)), "BYTES"),
        },
        f"the limit is {TEXT_MAX_PASSAGES}",
    ),
    "too many characters": (
        {
            "question": (_bytes(QUESTION), "BYTES"),
            "passages": (_bytes("a. " * (TEXT_MAX_CHARS // 3 + 10)), "BYTES"),
        },
        f"more than {TEXT_MAX_CHARS} characters",
    ),
    "question over the token limit": (
        {"question": (_bytes("why " * 2000), "BYTES"), "passages": (_bytes("fine."), "BYTES")},
        "Shorten the question",
    ),
    "question without passages": ({"question": (_bytes(QUESTION), "BYTES")}, "passages is required"),
    "two questions": (
        {"question": (_bytes(QUESTION, QUESTION), "BYTES"), "passages": (_bytes("fine."), "BYTES")},
        "question",
    ),
    "question as INT32": (
        {"question": (np.array([1], dtype=np.int32), "INT32"), "passages": (_bytes("fine."), "BYTES")},
        "data-type|datatype|dtype",
    ),
    "passages as a matrix": (
        {"question": (_bytes(QUESTION), "BYTES"), "passages": (_bytes("a.", "b.").reshape(1, 2), "BYTES")},
        "shape|dims",
    ),
    "threshold out of range": (
        {
            "question": (_bytes(QUESTION), "BYTES"),
            "passages": (_bytes("fine."), "BYTES"),
            "threshold": (np.array([1.5], dtype=np.float32), "FP32"),
        },
        "threshold must be in",
    ),
    "threshold NaN": (
        {
            "question": (_bytes(QUESTION), "BYTES"),
            "passages": (_bytes("fine."), "BYTES"),
            "threshold": (np.array([np.nan], dtype=np.float32), "FP32"),
        },
        "finite",
    ),
    "top_k zero": (
        {
            "question": (_bytes(QUESTION), "BYTES"),
            "passages": (_bytes("fine."), "BYTES"),
            "top_k": (np.array([0], dtype=np.int32), "INT32"),
        },
        "top_k must be a positive",
    ),
    "unknown title rule": (
        {
            "question": (_bytes(QUESTION), "BYTES"),
            "passages": (_bytes("fine."), "BYTES"),
            "title": (_bytes("always"), "BYTES"),
        },
        "title must be one of",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_gets_its_own_error(server, pruners, case):
    inputs, message = BAD[case]
    with pytest.raises(Exception, match=message):
        _raw_infer(server, "xprovence_text", inputs)
    # the server keeps serving, correctly
    assert server.ready()
    good = Pruner.connect(server.grpc_url, "xprovence_text")
    same(good.prune(QUESTION, PASSAGES[:2]), pruners["xprovence"][0].prune(QUESTION, PASSAGES[:2]))


def test_bad_request_beside_good_ones(server, pruners):
    """Bad and good requests at the same time: each good one gets its own right result."""
    expected = pruners["xprovence"][0].prune(QUESTION, PASSAGES[:3])
    bad_cases = [
        BAD["invalid UTF-8 in a passage"][0],
        BAD["question over the token limit"][0],
        BAD["empty question"][0],
    ]
    good, bad = [], []
    barrier = threading.Barrier(12)

    def run_good():
        p = Pruner.connect(server.grpc_url, "xprovence_text")
        barrier.wait()
        good.append(p.prune(QUESTION, PASSAGES[:3]))

    def run_bad(k):
        barrier.wait()
        try:
            _raw_infer(server, "xprovence_text", bad_cases[k % 3])
            bad.append(None)
        except Exception as exc:
            bad.append(str(exc))

    threads = [threading.Thread(target=run_good) for _ in range(9)] + [
        threading.Thread(target=run_bad, args=(k,)) for k in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(good) == 9 and len(bad) == 3 and all(bad)
    for got in good:
        same(got, expected)


def test_http_client_errors_are_clear(server):
    """An input the server refuses (only the server knows the question's token count) is an
    InputError on the client, with the message the in-process pruner gives."""
    remote = Pruner.connect(server.http_url, "xprovence_text", protocol="http")
    with pytest.raises(InputError, match=r"^the question is \d+ tokens; .* Shorten the question\.$"):
        remote.prune("why " * 2000, ["fine."])
    with pytest.raises(InputError, match="sentences="):
        remote.prune(QUESTION, ["fine."], sentences=[["fine."]])
    with pytest.raises(InputError, match="title"):
        remote.prune(QUESTION, ["fine."], title="always")


def test_core_client_gets_its_tokenizer_from_the_text_model(server, pruners, repository):
    """No config carries the tokenizer; a client of the core fetches it from `<name>_text`."""
    for name in FAMILY_NAMES:
        text = (repository / name / "config.pbtxt").read_text()
        cfg = text_format.Parse(text, model_config_pb2.ModelConfig())
        assert not [k for k in cfg.parameters if "tokenizer" in k] and len(text) < 10_000
        assert (repository / f"{name}_text" / "1" / "tokenizer.json").is_file()
    core = Pruner.connect(server.grpc_url, "embedding")
    same(core.prune(QUESTION, UNICODE), pruners["embedding"][0].prune(QUESTION, UNICODE))


@pytest.mark.parametrize("target", ["cpu", "gpu-onnx", "gpu-tensorrt"])
def test_text_model_config_is_a_valid_triton_config(exported, tmp_path, target):
    build_repository(
        exported["xprovence"],
        tmp_path,
        RepositoryOptions(target=target, name="m", max_batch_size=32, text_instances=3),
        log=lambda m: None,
    )
    cfg = text_format.Parse(
        (tmp_path / "m_text" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert cfg.name == "m_text" and cfg.backend == "python" and cfg.max_batch_size == 0
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert cfg.instance_group[0].count == 3
    types = {i.name: (i.data_type, list(i.dims), i.optional) for i in cfg.input}
    assert types["question"] == (model_config_pb2.TYPE_STRING, [1], True)
    assert types["passages"] == (model_config_pb2.TYPE_STRING, [-1], True)
    outs = {o.name: (o.data_type, list(o.dims)) for o in cfg.output}
    assert outs["sentence_spans"] == (model_config_pb2.TYPE_INT64, [-1, -1, 2])
    assert outs["kept"] == (model_config_pb2.TYPE_BOOL, [-1, -1])
    assert outs["pruned_context"] == (model_config_pb2.TYPE_STRING, [-1])
    assert cfg.parameters["core_model"].string_value == "m"
    assert cfg.parameters["core_max_batch_size"].string_value == "32"
    folder = tmp_path / "m_text" / "1"
    assert {p.name for p in folder.iterdir()} >= {"model.py", "tokenizer.json", "manifest.json"}
    core = text_format.Parse((tmp_path / "m" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert core.parameters["prune_text_model"].string_value == "m_text"
    assert all("tokenizer" not in k for k in core.parameters)


def test_describe_request_over_http(server):
    client = httpclient.InferenceServerClient(server.http_url)
    res = client.infer("opensearch_text", [], outputs=[httpclient.InferRequestedOutput("manifest")])
    assert json.loads(res.as_numpy("manifest")[0])["family"] == "opensearch"
    with pytest.raises(Exception, match="question and passages are required"):
        _raw_infer(server, "opensearch_text", {"threshold": (np.array([0.5], dtype=np.float32), "FP32")})


def _answers(results):
    """Everything a caller sees of a call, exactly: spans, probabilities and the reranking
    score (as the float32 the wire carries), kept flags, texts."""
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    return [
        (
            [(s.start, s.end, f32(s.probability), s.kept) for s in r.sentences],
            f32(r.reranking_score),
            r.pruned_context,
        )
        for r in results
    ]


def test_served_int8_model_equals_in_process_int8(server, exported_int8):
    """INT8 through the server equals the in-process INT8 engine bit for bit: the core runs
    each request alone (join_requests auto for an INT8 graph), and a request is one batch
    of one call, cut as in process (the text model's batches hold at most the core's
    max_batch_size rows: the same here)."""
    local = Pruner.load(exported_int8, threads=1, batching=BatchingConfig(max_batch_size=CORE_MAX_BATCH))
    remote = Pruner.connect(server.grpc_url, "xprovence_int8_text")
    passages = PASSAGES + UNICODE
    got, exp = remote.prune(QUESTION, passages), local.prune(QUESTION, passages)
    assert _answers(got) == _answers(exp)
    assert sum(r.blocks for r in got) == sum(r.blocks for r in exp)


def test_int8_answers_do_not_depend_on_their_batch_company(server, exported_int8):
    """Dynamic INT8 takes activation scales per batch, so a core run that joined requests
    would move each answer with its neighbours (measured: docs/decisions.md, batch company).
    12 different calls from 4 concurrent clients, 3 times each in shuffled order, must each
    equal the same call sent alone, bit for bit, in a round where the core batcher really
    grouped requests (fewer executions than requests)."""
    import random

    local = Pruner.load(exported_int8, threads=1, batching=BatchingConfig(max_batch_size=CORE_MAX_BATCH))
    docs = PASSAGES + UNICODE
    calls = [
        (f"{QUESTION} (variant {i})", [docs[(i + k) % len(docs)] for k in range(1 + i % 4)])
        for i in range(12)
    ]
    expected = [_answers(local.prune(q, ps)) for q, ps in calls]
    clients = [Pruner.connect(server.grpc_url, "xprovence_int8_text") for _ in range(4)]
    grouped = []
    for attempt in range(3):
        req0, exe0 = _stats(server, "xprovence_int8")
        wrong, errors = [], []
        barrier = threading.Barrier(len(clients))

        def client(k, attempt=attempt):
            order = [i for i in range(len(calls)) for _ in range(3)]
            random.Random(k * 10 + attempt).shuffle(order)
            barrier.wait()
            for i in order:
                try:
                    if _answers(clients[k].prune(*calls[i])) != expected[i]:
                        wrong.append(i)
                except Exception as exc:  # collected, asserted below
                    errors.append(repr(exc))

        run_in_threads(client, len(clients), join_s=120)
        req1, exe1 = _stats(server, "xprovence_int8")
        print(
            f"\nINT8 company round {attempt}: {req1 - req0} core requests in {exe1 - exe0} executions, "
            f"{len(wrong)} answers differing from the call sent alone"
        )
        assert not errors, errors[:3]
        assert not wrong, f"calls {sorted(set(wrong))} answered differently beside other requests"
        grouped.append(exe1 - exe0 < req1 - req0)
        if grouped[-1]:
            break
    assert any(grouped), "the core batcher grouped no requests: the test saw no company"


def test_int8_core_runs_requests_alone_by_default(repository, exported, exported_int8, tmp_path):
    """The configs say what the core does: INT8 graphs run each request alone (auto), fp32
    graphs join them; `always` and `never` override; `never` needs the cpu target."""
    from engine.errors import ExportError

    def joins(folder):
        text = (folder / "config.pbtxt").read_text()
        return json.loads(text.split('key: "join_requests"')[1].split("string_value: ")[1].split()[0])

    assert joins(repository / "xprovence_int8") == "false"
    assert joins(repository / "xprovence") == "true"
    for folder, join, want in [(exported_int8, "always", "true"), (exported["xprovence"], "never", "false")]:
        out = build_repository(
            folder,
            tmp_path / join,
            RepositoryOptions(join_requests=join, text_model=False),
            log=lambda m: None,
        )
        assert joins(out) == want
    with pytest.raises(ExportError, match="join_requests never needs the cpu target"):
        build_repository(
            exported_int8,
            tmp_path / "gpu",
            RepositoryOptions(target="gpu-onnx", join_requests="never"),
            log=lambda m: None,
        )
    notes = []
    build_repository(exported_int8, tmp_path / "gpu", RepositoryOptions(target="gpu-onnx"), log=notes.append)
    assert any("batch company" in n for n in notes)
    assert "join_requests" not in (tmp_path / "gpu" / "xprovence_int8" / "config.pbtxt").read_text()


@pytest.mark.parametrize("name", ["opensearch", "open_provence"])
def test_text_model_runs_the_windows_asked_for(server, pruners, name):
    """`windows=` travels to the text model: the family's default (reference) when not
    given, or the one asked for, each equal to the in-process pruner's, and recorded in the
    results; a bad value is refused on the client and, sent raw, by the server."""
    ort_p, _ = pruners[name]
    remote = Pruner.connect(server.grpc_url, f"{name}_text")
    passage = " ".join(
        f"Sentence {i} says the stadium held {i} thousand people in {1900 + i}, {'and more words ' * (i % 7)}"
        for i in range(60)
    )
    got = {}
    for windows in (None, "reference", "sentences"):
        got[windows] = remote.prune(QUESTION, [passage], **({"windows": windows} if windows else {}))[0]
        want = ort_p.prune(QUESTION, [passage], **({"windows": windows} if windows else {}))[0]
        assert got[windows].windows == want.windows == (windows or "reference")
        np.testing.assert_allclose(
            [s.probability for s in got[windows].sentences],
            [s.probability for s in want.sentences],
            atol=1e-5,
        )
        assert [s.kept for s in got[windows].sentences] == [s.kept for s in want.sentences]
        assert got[windows].blocks == want.blocks
    differ = sum(
        a.probability != pytest.approx(b.probability, abs=1e-5)
        for a, b in zip(got["sentences"].sentences, got["reference"].sentences)
    )
    assert differ > 0  # the server really ran the other windowing
    with pytest.raises(InputError, match="windows must be one of"):
        remote.prune(QUESTION, [passage], windows="tokens")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = []
    for n, v in (("question", [b"Q?"]), ("passages", [b"A passage."]), ("windows", [b"tokens"])):
        inp = grpcclient.InferInput(n, [len(v)], "BYTES")
        inp.set_data_from_numpy(np.array(v, dtype=np.object_))
        inputs.append(inp)
    with pytest.raises(Exception, match="windows must be one of"):
        client.infer(f"{name}_text", inputs)


@pytest.mark.parametrize("model", ["opensearch_ov", "embedding_ovint8"])
def test_openvino_core_serves_what_openvino_gives_in_process(server, exported, exported_ov_int8, model):
    """The cpu target's python core on OpenVINO (`--backend openvino`; an ov-int8 IR always):
    the text model's answers equal the in-process OpenVINO pruner of the same folder (the
    same graph and runtime: probabilities within 1e-5, the same kept flags and texts)."""
    folder = exported["opensearch"] if model == "opensearch_ov" else exported_ov_int8
    cfg = text_format.Parse(
        (server.repository / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    graph = "model.onnx" if model == "opensearch_ov" else "model.xml"
    assert (cfg.backend, cfg.parameters["runtime"].string_value, cfg.parameters["graph"].string_value) == (
        "python",
        "openvino",
        graph,
    )
    assert (server.repository / model / "1" / graph).is_file()
    local = Pruner.load(folder, backend="openvino", threads=1)
    remote = Pruner.connect(server.grpc_url, f"{model}_text")
    passages = PASSAGES + UNICODE
    expected = local.prune(QUESTION, passages)
    same(remote.prune(QUESTION, passages), expected)
    t = _splitting_threshold(expected)
    same(remote.prune(QUESTION, passages, threshold=t), local.prune(QUESTION, passages, threshold=t))
    # the IR is quantized: ONNX Runtime's fp32 answers are outside that tolerance, so the
    # equality above could not hold for a core that ran anything else
    if model == "embedding_ovint8":
        ort = Pruner.load(exported["embedding"], threads=1).prune(QUESTION, passages)
        assert (
            max(
                abs(a.probability - b.probability)
                for ra, rb in zip(ort, expected)
                for a, b in zip(ra.sentences, rb.sentences)
            )
            > TOL
        )
