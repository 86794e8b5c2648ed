"""Requests that must not break the server or reach past their own error: out-of-bounds
inputs to the core model, a bad request in a dynamic batch beside good ones, the admin
APIs (shared memory, logging, tracing) locked by default; and clear in-process errors."""

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from engine.errors import InputError, ModelLoadError, SettingError
from engine.measuring import call_batches
from engine.pruner import Pruner
from engine.triton.server import ADMIN_HEADER, TritonServer
from tests.utils import free_ports
from tests.utils import PASSAGES, QUESTION

pytestmark = pytest.mark.server


def _status_mb(field: str, pid: int | str = "self") -> float:
    """A field of a process's /proc status (VmRSS, VmHWM) in MB."""
    line = next(
        ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith(field + ":")
    )
    return int(line.split()[1]) / 1024


def _core_request(server, arrays, model="opensearch"):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensors = []
    for n, a in arrays.items():
        t = grpcclient.InferInput(n, list(a.shape), "INT64")
        t.set_data_from_numpy(a)
        tensors.append(t)
    return client.infer(model, tensors, client_timeout=30)


def _good_arrays(pruners, name="opensearch"):
    local = pruners[name][0]
    batch = call_batches(local, QUESTION, PASSAGES[:1], [[(0, 15)]])[0]
    return batch.inputs(local.spec.input_names), local.backend.infer(batch)


def _with(arrays, **changes):
    out = {k: v.copy() for k, v in arrays.items()}
    out.update(changes)
    return out


def _stub_rss_mb(server, model: str) -> float:
    """Resident memory of the python-backend stub that runs `model` on `server`."""
    for pid in server.stub_pids():
        if f"/{model}/1/model.py".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            return _status_mb("VmRSS", pid)
    raise AssertionError(f"no stub for {model}")


#: the core stub of a tiny test model stays under this after any hostile request (it is
#: about 100-200 MB; an unbounded request grew it to 3.4 GB before the checks)
STUB_RSS_BOUND_MB = 600

HOSTILE = {
    "longer than the window": (
        lambda a: {k: np.zeros((1, 600), dtype=np.int64) for k in a},
        "exceeds the model's window",
    ),
    "an 8,192-token row": (
        lambda a: {k: np.zeros((1, 8192), dtype=np.int64) for k in a},
        "exceeds the model's window",
    ),
    "sentence id 10**7": (
        lambda a: _with(a, sentence_ids=np.where(a["sentence_ids"] >= 0, 10**7, -1)),
        "sentence_ids must be within",
    ),
    "sentence id below -1": (
        lambda a: _with(a, sentence_ids=a["sentence_ids"] - 5),
        "sentence_ids must be within",
    ),
    "negative input id": (lambda a: _with(a, input_ids=-a["input_ids"] - 1), "input_ids must be within"),
    "input id past the vocabulary": (
        lambda a: _with(a, input_ids=a["input_ids"] + 10**6),
        "input_ids must be within",
    ),
    "attention mask of 7": (
        lambda a: _with(a, attention_mask=a["attention_mask"] * 7),
        "attention_mask must be 0 or 1",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_core_refuses_out_of_bounds_input_and_keeps_serving(server, pruners, case):
    good, (r_exp, p_exp) = _good_arrays(pruners)
    make, message = HOSTILE[case]
    with pytest.raises(Exception, match=message):
        _core_request(server, make(good))
    assert server.ready()
    res = _core_request(server, good)
    np.testing.assert_allclose(res.as_numpy("sentence_probs"), p_exp, atol=1e-5)
    rss = _stub_rss_mb(server, "opensearch")
    print(f"\n{case}: refused; stub RSS {rss:.0f} MB")
    assert rss < STUB_RSS_BOUND_MB


def test_a_bad_request_fails_alone_in_its_dynamic_batch(server, pruners):
    """One request with an out-of-vocabulary id fired beside 8 good ones, 10 times: every
    good one gets its right result, the bad one its error."""
    good, (_, p_exp) = _good_arrays(pruners)
    bad = HOSTILE["input id past the vocabulary"][0](good)
    ok, errors, wrong = [], [], []
    for _ in range(10):
        barrier = threading.Barrier(9)

        def send(arrays, is_bad):
            barrier.wait()
            try:
                res = _core_request(server, arrays)
                if is_bad:
                    wrong.append("bad request answered")
                elif np.abs(res.as_numpy("sentence_probs") - p_exp).max() > 1e-5:
                    wrong.append("wrong result")
                else:
                    ok.append(1)
            except Exception as exc:
                (errors if is_bad else wrong).append(str(exc))

        threads = [threading.Thread(target=send, args=(good, False)) for _ in range(8)]
        threads.append(threading.Thread(target=send, args=(bad, True)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not wrong, wrong[:3]
    assert len(ok) == 80 and len(errors) == 10


def test_admin_apis_are_refused_by_default(server):
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(Exception, match="is restricted"):
        http.register_system_shared_memory("evil", "/prune-test-evil", 1024)
    with pytest.raises(Exception, match="is restricted"):
        grpc.register_system_shared_memory("evil", "/prune-test-evil", 1024)
    with pytest.raises(Exception, match="is restricted"):
        http.update_log_settings({"log_verbose_level": 5})
    with pytest.raises(Exception, match="is restricted"):
        grpc.update_log_settings({"log_verbose_level": 5})
    with pytest.raises(Exception, match="is restricted"):
        http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    with pytest.raises(Exception, match="not allowed"):  # --model-control-mode=none
        http.load_model("opensearch")
    with pytest.raises(Exception, match="not allowed"):
        grpc.unload_model("opensearch")
    # inference, health, metadata and statistics stay open
    assert http.is_server_ready() and grpc.get_inference_statistics("opensearch").model_stats


def test_admin_key_opens_the_admin_apis(tmp_path):
    h, g, m = free_ports(3)
    empty = tmp_path / "models"  # the admin APIs need no model: a server with none starts in seconds
    empty.mkdir()
    with TritonServer(empty, http_port=h, grpc_port=g, metrics_port=m, admin_key="s3cret") as s:
        http = httpclient.InferenceServerClient(s.http_url)
        with pytest.raises(Exception):
            http.update_log_settings({"log_verbose_level": 1})
        with pytest.raises(Exception):
            http.update_log_settings({"log_verbose_level": 1}, headers={ADMIN_HEADER: "wrong"})
        assert http.update_log_settings({"log_verbose_level": 1}, headers={ADMIN_HEADER: "s3cret"})


# --------------------------------------------------------------- in process


def test_clear_errors_in_process(pruners, checkpoints, tmp_path):
    p = pruners["opensearch"][0]
    with pytest.raises(InputError, match="passage 1 is not valid Unicode: a lone surrogate"):
        p.prune(QUESTION, ["fine.", "bad \ud800 text"])
    with pytest.raises(InputError, match="the question is not valid Unicode"):
        p.prune("why \udfff?", ["fine."])
    with pytest.raises(InputError, match=r"sentences\[0\] must be a list"):
        p.prune(QUESTION, ["fine."], sentences=[None])
    with pytest.raises(InputError, match=r"sentences\[0\] must be a list"):
        p.prune(QUESTION, ["fine."], sentences=["fine."])
    # numpy scalars are numbers: accepted
    a = p.prune(QUESTION, PASSAGES[:2], threshold=np.float32(0.25), alpha=np.float64(0.1))
    b = p.prune(QUESTION, PASSAGES[:2], threshold=0.25, alpha=0.1)
    assert [s.kept for r in a for s in r.sentences] == [s.kept for r in b for s in r.sentences]
    from engine.pytorch.modeling import load_checkpoint
    import shutil

    folder = tmp_path / "listcfg"
    shutil.copytree(checkpoints["opensearch"], folder)
    (folder / "config.json").write_text(json.dumps([1, 2, 3]))
    with pytest.raises(ModelLoadError, match="expected a JSON object, got a JSON list"):
        load_checkpoint(folder)


def test_text_client_refuses_lone_surrogates(server):
    remote = Pruner.connect(server.grpc_url, "opensearch_text")
    with pytest.raises(InputError, match="passage 0 is not valid Unicode"):
        remote.prune(QUESTION, ["bad \ud800"])


def test_huge_config_is_refused_before_any_allocation(checkpoints, tmp_path):
    """A 40 KB checkpoint whose config.json claims a huge model: refused by comparing the
    config with the weights' shapes on a meta model, using almost no memory. The peak is
    this process's VmHWM, reset first (clear_refs 5), so pytest's earlier peak cannot hide
    an allocation below it."""
    import shutil
    from engine.pytorch.modeling import load_checkpoint

    folder = tmp_path / "huge-config"
    shutil.copytree(checkpoints["opensearch"], folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_size=4096, intermediate_size=16384, num_attention_heads=32, vocab_size=250_000)
    (folder / "config.json").write_text(json.dumps(config))
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status_mb("VmHWM")
    with pytest.raises(ModelLoadError, match="has shape .* the config implies"):
        load_checkpoint(folder)
    grew_mb = _status_mb("VmHWM") - before
    assert grew_mb < 200, f"peak memory grew {grew_mb:.0f} MB"  # the real model would need ~5 GB


@pytest.mark.parametrize(
    "change, message",
    [
        ({"max_length": 20_000_000}, "max_length 20000000 is outside"),
        ({"max_length": "x"}, "manifest is incomplete"),
        ({"buckets": [64, 32]}, "not increasing"),
        ({"buckets": [32, 10**9]}, "within the window"),
        ({"tokenizer": {"cls_id": -5, "sep_id": 2, "pad_id": 0}}, "must be >= 0"),
    ],
)
def test_a_served_manifest_is_bounded_before_use(exported, change, message):
    from engine.pipeline.spec import Manifest

    manifest = {**Manifest.read(exported["opensearch"]).to_dict(), **change}
    with pytest.raises(ModelLoadError, match=message):
        Manifest.from_dict(manifest)


@pytest.mark.parametrize("family", ["provence", "xprovence", "open_provence", "opensearch", "embedding"])
def test_the_graph_bounds_sentences_by_the_length(exported, pruners, family):
    """The graph itself caps S at L, so a target without the python backend's checks (GPU
    onnxruntime or TensorRT in NVIDIA's container) cannot be made to allocate by an id:
    sentence ids of 10**7 give at most L columns; valid ids give the usual result."""
    import onnxruntime as ort

    good, (_, p_exp) = _good_arrays(pruners, family)
    session = ort.InferenceSession(str(exported[family] / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    _, probs = session.run(None, {n: good[n] for n in names})
    np.testing.assert_allclose(probs, p_exp, atol=1e-5)
    hostile = _with(good, sentence_ids=np.where(good["sentence_ids"] >= 0, 10**7, -1))
    _, probs = session.run(None, {n: hostile[n] for n in names})
    assert probs.shape[1] <= good["input_ids"].shape[1]


def _shrinks(run_options) -> bool:
    try:
        return run_options.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
    except Exception:  # no such entry: the arena keeps its peak
        return False


def test_onnxruntime_gives_memory_back_by_default(exported, monkeypatch, tmp_path):
    """The arena is shrunk after every run larger than SHRINK_ABOVE_TOKENS padded tokens
    unless told otherwise (PRUNE_ORT_ARENA; the server's core model: the ort_arena and
    ort_shrink_above_tokens parameters); a wrong value is a clear error.
    what it buys, measured (docs/decisions.md, memory): 1,354 -> 158 MB after a 32 x 512 batch."""
    from engine.backends.onnxruntime import SHRINK_ABOVE_TOKENS, OnnxRuntimeBackend
    from export.triton_repository import RepositoryOptions, build_repository

    graph = exported["opensearch"] / "model.onnx"
    monkeypatch.delenv("PRUNE_ORT_ARENA", raising=False)
    default = OnnxRuntimeBackend(graph)
    assert default.arena == "shrink"
    assert _shrinks(default.runs(SHRINK_ABOVE_TOKENS + 1)) and not _shrinks(default.runs(SHRINK_ABOVE_TOKENS))
    seen = []
    real_run = default.session.run
    default.session = type(
        "Recording",
        (),
        {"run": lambda self, out, feed, opts: seen.append(_shrinks(opts)) or real_run(out, feed, opts)},
    )()
    from engine.pipeline.encode import ModelBatch

    for rows, length in [(2, 16), (SHRINK_ABOVE_TOKENS // 64 + 1, 64)]:
        ones = np.ones((rows, length), dtype=np.int64)
        default.infer(
            ModelBatch(
                input_ids=ones * 5,
                attention_mask=ones,
                sentence_ids=ones * 0,
                token_type_ids=ones * 0,
                blocks=list(range(rows)),
            )
        )
    assert seen == [False, True]  # the small batch keeps the arena, the large one shrinks it
    from engine.models.loading import LoadOptions  # the variable is read where a process starts

    monkeypatch.setenv("PRUNE_ORT_ARENA", "keep")
    kept = OnnxRuntimeBackend(graph, arena=LoadOptions.from_env().arena)
    assert not _shrinks(kept.runs(10**6))
    assert Pruner.load(exported["opensearch"]).backend.arena == "keep"
    monkeypatch.setenv("PRUNE_ORT_ARENA", "bogus")
    with pytest.raises(SettingError, match="PRUNE_ORT_ARENA must be one of"):
        LoadOptions.from_env()
    with pytest.raises(SettingError, match="PRUNE_ORT_ARENA must be one of"):
        Pruner.load(exported["opensearch"])
    build_repository(exported["opensearch"], tmp_path, RepositoryOptions(name="m"), log=lambda m: None)
    config = (tmp_path / "m" / "config.pbtxt").read_text()
    assert 'key: "ort_arena"\n  value: { string_value: "shrink" }' in config
    assert 'key: "ort_denormals"\n  value: { string_value: "flush" }' in config
    assert f'key: "ort_shrink_above_tokens"\n  value: {{ string_value: "{SHRINK_ABOVE_TOKENS}" }}' in config


def test_a_call_at_the_character_limit_stays_under_its_memory_bound(exported):
    """The largest call the client accepts (PRUNE_MAX_CALL_CHARS' default in one passage, the costliest
    shape) peaks under the documented bound (docs/limits.md: 1.4 GB with the default
    model; the tokenizer's share is the same for any model). In its own process, so the
    peak is this call's: VmHWM, not ru_maxrss, which a child inherits from pytest's own peak."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from engine.pruner import Pruner\n"
        "from engine.settings import DEFAULTS\n"
        "MAX_CALL_CHARS = DEFAULTS.max_call_chars\n"
        "p = Pruner.load(sys.argv[1])\n"
        "q = 'what is it?'\n"
        "words = 'The stadium was built in 1923 and it holds eighty thousand people. '\n"
        "passage = (words * (MAX_CALL_CHARS // len(words) + 1))[:MAX_CALL_CHARS - len(q)]\n"
        "r = p.prune(q, [passage])[0]\n"
        "assert len(r.sentences) > 20000, len(r.sentences)\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
        "print(int(hwm.split()[1]) // 1024)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(exported["opensearch"])], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak = int(proc.stdout.split()[-1])
    print(f"\none call of 2,000,000 characters in one passage: peak RSS {peak} MB")
    assert peak < 1600
