"""`prune serve` takes its tritonserver (and the python-backend stubs) down with it: on
SIGTERM and SIGHUP exactly as on Ctrl-C (drain, stop, temporary folder removed, exit 0),
and when killed outright (SIGKILL) through its watchdog. Within a few seconds no server
process is left and the ports bind again.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.triton.server import TritonServer
from export.triton_repository import RepositoryOptions, build_repository
from tests.utils import free_ports, milvus_calls, processes_under, start_serve

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def small_repository(exported, tmp_path_factory):
    repo = tmp_path_factory.mktemp("signal_repository")
    build_repository(
        exported["opensearch"],
        repo,
        RepositoryOptions(target="cpu", name="m", text_instances=1),
        log=lambda m: None,
    )
    return repo


def _ports_free(ports):
    """No process listens on them (SO_REUSEADDR, as servers bind: TIME_WAIT connections
    left by the test's own requests do not count)."""
    for p in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_signal_to_prune_serve_leaves_nothing_behind(small_repository, sig):
    ports = free_ports(3)
    proc, lines = start_serve(small_repository, ports)
    procs = processes_under(small_repository)
    server_cmd = next(
        cmd for pid, cmd in procs.items() if "tritonserver" in cmd and "--model-repository" in cmd
    )
    stubs = [pid for pid, cmd in procs.items() if "triton_python_backend_stub" in cmd]
    assert len(stubs) == 2  # the core and the text model
    workdir = Path(re.search(r"--backend-directory=(\S+)/backends", server_cmd).group(1))
    assert workdir.is_dir()
    t0 = time.monotonic()
    proc.send_signal(sig)
    code = proc.wait(30)
    while (processes_under(small_repository) or not _ports_free(ports)) and time.monotonic() - t0 < 10:
        time.sleep(0.1)
    gone = time.monotonic() - t0
    assert not processes_under(small_repository), f"left behind after {sig.name}"
    assert _ports_free(ports)
    assert gone < 10
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
    else:
        assert code == 0, "".join(lines[-20:])
        assert any(f"{sig.name}: tritonserver drained and stopped" in line for line in lines)
    deadline = time.monotonic() + 5
    while workdir.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not workdir.exists()  # the temporary folder is removed
    # a new server binds the same ports
    with TritonServer(small_repository, http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2]) as s:
        assert s.ready()


def test_server_class_stop_waits_for_the_stubs(small_repository):
    h, g, m = free_ports(3)
    server = TritonServer(small_repository, http_port=h, grpc_port=g, metrics_port=m).start()
    assert (
        len([c for c in processes_under(small_repository).values() if "triton_python_backend_stub" in c]) == 2
    )
    assert server.stop() is True
    assert not processes_under(small_repository)  # stubs included, the moment stop returns


def test_killed_starter_takes_the_server_down(small_repository, tmp_path):
    """A Python process that started a TritonServer and dies by SIGKILL leaves nothing."""
    h, g, m = free_ports(3)
    script = tmp_path / "starter.py"
    script.write_text(
        "import sys, time\nfrom engine.triton.server import TritonServer\n"
        f"s = TritonServer({str(small_repository)!r}, http_port={h}, grpc_port={g}, metrics_port={m}).start()\n"
        "print('up', flush=True)\ntime.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.stdout.readline().strip() == "up"
    assert processes_under(small_repository)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 10
    while (processes_under(small_repository) or not _ports_free([h, g, m])) and time.monotonic() < deadline:
        time.sleep(0.1)  # the ports too, as after a signal: they are released a moment after the processes
    assert not processes_under(small_repository)
    assert _ports_free([h, g, m])


HANGING_MODEL = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]) for r in requests]

    def finalize(self):
        time.sleep(120)    # a stub that will not end in time
"""


def test_stop_kills_what_does_not_end_in_time(tmp_path):
    repo = tmp_path / "hang-repo"
    (repo / "hang" / "1").mkdir(parents=True)
    (repo / "hang" / "1" / "model.py").write_text(HANGING_MODEL)
    (repo / "hang" / "config.pbtxt").write_text(
        'name: "hang"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    h, g, m = free_ports(3)
    server = TritonServer(repo, http_port=h, grpc_port=g, metrics_port=m).start()
    assert processes_under(repo)
    t0 = time.monotonic()
    assert server.stop(timeout=3) is False  # did not end by itself: killed
    assert time.monotonic() - t0 < 15
    assert not processes_under(repo)


def _wait_for(lines, text, start, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in line for line in lines[start:]):
            return True
        time.sleep(0.1)
    return False


def test_prune_serve_restarts_a_dead_server_or_stub(small_repository, pruners):
    """A model whose stub died stays "ready" in Triton while failing every request, and
    one HTTP request declaring a huge shape aborts tritonserver 2.51 (std::bad_alloc):
    `prune serve` sees both and restarts the server; the same client then works again."""
    import json
    import urllib.request
    from engine.errors import BackendError
    from engine.pruner import Pruner

    ports = free_ports(3)
    proc, lines = start_serve(small_repository, ports)
    try:
        # generous deadlines: each wait ends as soon as what it waits for happens (a busy machine restarts slowly)
        client = Pruner.connect(f"127.0.0.1:{ports[1]}", "m_text", timeout=90, retries=30, backoff=0.5)
        doc = ["The stadium was built in 1923. It holds 80,000 people."]
        expected = pruners["opensearch"][0].prune("When?", doc)[0].pruned_context
        assert client.prune("When?", doc)[0].pruned_context == expected
        # 1. a stub killed outright
        stub = next(
            pid
            for pid, cmd in processes_under(small_repository).items()
            if "triton_python_backend_stub" in cmd and "/m/1/model.py" in cmd
        )
        mark = len(lines)
        t0 = time.monotonic()
        os.kill(stub, signal.SIGKILL)
        assert _wait_for(lines, "stub(s) died: restarting", mark), "".join(lines[-20:])
        assert _wait_for(lines, "ready again", mark)
        back = time.monotonic() - t0
        assert client.prune("When?", doc)[0].pruned_context == expected
        # 2. the request that aborts tritonserver
        body = {
            "inputs": [
                {"name": n, "shape": [1, 10**12], "datatype": "INT64", "data": [1]}
                for n in ("input_ids", "attention_mask", "token_type_ids", "sentence_ids")
            ]
        }
        mark = len(lines)
        req = urllib.request.Request(
            f"http://127.0.0.1:{ports[0]}/v2/models/m/infer",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(req, timeout=10).read()
        except Exception:
            pass
        assert _wait_for(lines, "restarting tritonserver", mark)
        assert _wait_for(lines, "ready again", mark)
        assert client.prune("When?", doc)[0].pruned_context == expected
        # 3. a gRPC request whose declared shape overflows its byte size (2**61 x 8 bytes
        # wraps to 0, so Triton 2.51 passes an empty tensor of that shape on): the stub dies
        import tritonclient.grpc as grpcclient
        from tritonclient.grpc import service_pb2

        request = service_pb2.ModelInferRequest(model_name="m")
        for n in ("input_ids", "attention_mask", "token_type_ids", "sentence_ids"):
            request.inputs.add(name=n, datatype="INT64", shape=[1, 2**61])
            request.raw_input_contents.append(b"")
        mark = len(lines)
        raw = grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}")
        with pytest.raises(Exception, match="is not healthy"):
            raw._client_stub.ModelInfer(request=request, timeout=30)
        # the client retries "stub not healthy" within its deadline: this call outlives the restart
        t0 = time.monotonic()
        assert client.prune("When?", doc)[0].pruned_context == expected
        through = time.monotonic() - t0
        assert _wait_for(lines, "stub(s) died: restarting", mark)
        print(
            f"\nstub killed: serving again after {back:.1f} s; a call made right after the gRPC "
            f"overflow request returned the right result in {through:.1f} s"
        )
        with pytest.raises(BackendError):  # a client alone, with no server at all: a clear error
            Pruner.connect("127.0.0.1:9", "m_text", ready_timeout=1)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_a_dead_stub_turns_the_apis_health_503_and_back(small_repository, pruners):
    """`prune serve`'s own HTTP API in front of its text model, on --host 0.0.0.0 while
    tritonserver stays on loopback with its HTTP endpoint off: a killed stub (Triton keeps the model "ready") shows
    as 503 on /health within seconds, and 200 again once `prune serve` has restarted the
    server."""
    pytest.importorskip("fastapi")
    import httpx

    ports = free_ports(5)
    proc, lines = start_serve(
        small_repository,
        ports[:3],
        ports[3],
        "--triton-http",
        "off",
        "--host",
        "0.0.0.0",
        "--model-service-port",
        str(ports[4]),
    )
    url = f"http://127.0.0.1:{ports[3]}"
    try:
        assert any("HTTP off" in line for line in lines), "".join(lines)
        server_cmd = next(
            cmd for cmd in processes_under(small_repository).values() if "--grpc-address" in cmd
        )
        for api in ("http", "grpc", "metrics"):  # the API faces clients (--host), Triton only loopback
            assert f"--{api}-address=127.0.0.1" in server_cmd, server_cmd
        with pytest.raises(httpx.ConnectError):  # Triton's own HTTP endpoint is off
            httpx.get(f"http://127.0.0.1:{ports[0]}/v2/health/ready", timeout=5)
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200
        probe = [
            sys.executable,
            "-m",
            "engine.remote.probe",
            "--url",
            f"127.0.0.1:{ports[1]}",
            "--model",
            "m_text",
            "--timeout",
            "3",
        ]
        assert subprocess.run(probe, capture_output=True, timeout=60).returncode == 0
        stub = next(
            pid
            for pid, cmd in processes_under(small_repository).items()
            if "triton_python_backend_stub" in cmd and "/m_text/1/model.py" in cmd
        )
        mark = len(lines)
        t0 = time.monotonic()
        os.kill(stub, signal.SIGKILL)
        # the liveness probe sees it too (in a thread beside the /health polls, since the restart
        # comes within seconds; the probe as a process is run above)
        from engine.remote.probe import main as probe_main

        dead: list[int] = []
        prober = threading.Thread(target=lambda: dead.append(probe_main(probe[3:])))
        prober.start()
        codes = []
        while time.monotonic() - t0 < 15:
            codes.append(httpx.get(f"{url}/health", timeout=30).status_code)
            if codes[-1] == 503:
                break
        down = time.monotonic() - t0
        assert codes[-1] == 503, codes
        prober.join(60)
        assert dead == [1]
        assert _wait_for(lines, "ready again", mark), "".join(lines[-20:])
        while time.monotonic() - t0 < 60 and httpx.get(f"{url}/health", timeout=30).status_code != 200:
            time.sleep(0.2)
        up = time.monotonic() - t0
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200
        doc = ["The stadium was built in 1923. It holds 80,000 people."]
        got = httpx.post(f"{url}/v1/prune", json={"question": "When?", "passages": doc}, timeout=30).json()
        assert (
            got["results"][0]["pruned_context"]
            == pruners["opensearch"][0].prune("When?", doc)[0].pruned_context
        )
        # Milvus's model service beside the API, on the same text model
        (answer,) = milvus_calls(
            f"127.0.0.1:{ports[4]}",
            [{"rpc": "Highlight", "query": "When?", "documents": doc, "params": {"threshold": "0.0"}}],
        )
        want = httpx.post(
            f"{url}/v1/prune", json={"question": "When?", "passages": doc, "threshold": 0.0}
        ).json()
        assert answer["code"] == "OK", answer
        assert (
            answer["results"][0]["sentences"]
            == [f"<em>{s['text']}</em>" for s in want["results"][0]["sentences"] if s["kept"]]
            != []
        )
        print(f"\n/health: 503 {down:.1f} s after the stub was killed, 200 again after {up:.1f} s")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert any("the HTTP API and tritonserver drained and stopped" in line for line in lines), "".join(
        lines[-5:]
    )
