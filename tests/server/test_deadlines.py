"""Deadlines both ways. A server that stops answering (behind a stalling proxy) never holds
a call past its deadline: each `prune()` returns, with a clear error, within `timeout`
(retries and backoff included), over gRPC and HTTP, for the text model and the core model.
And a call past the API's deadline stops using the server's workers: its work stops at the
next batch (engine.cancellation.check_cancelled), so `prune api` is idle again soon after the 504 or the
DEADLINE_EXCEEDED, and the next call is answered."""

import socket
import threading
import time

import pytest

from engine.errors import BackendError
from engine.pruner import Pruner
from tests.utils import PASSAGES, QUESTION, ApiProcess, free_ports, idle_within, milvus_calls

pytestmark = pytest.mark.server

SLACK = 0.75  # seconds of scheduling noise allowed past the deadline


class StallingProxy:
    """A TCP proxy on loopback that forwards to `port` until `stall` is set; then it keeps
    every connection open and forwards nothing, like a hung server behind a proxy."""

    def __init__(self, port: int):
        self.upstream = port
        self.stall = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            if not self.stall.is_set():
                try:
                    dst.sendall(data)
                except OSError:
                    return

    def close(self):
        self.closed = True
        for s in [self.sock, *self.conns]:
            try:
                s.close()
            except OSError:
                pass


@pytest.mark.parametrize(
    "model, protocol, reps",
    [("opensearch_text", "grpc", 8), ("opensearch_text", "http", 6), ("opensearch", "grpc", 6)],
)
def test_stalled_server_calls_end_within_their_deadline(server, model, protocol, reps):
    port = int((server.grpc_url if protocol == "grpc" else server.http_url).rsplit(":", 1)[1])
    proxy = StallingProxy(port)
    try:
        timeout = 1.5
        many = PASSAGES + [f"Passage {i}. About item {i}." for i in range(40)]  # several requests per call
        # through the proxy once, with time to spare: a busy machine's first call (the model's warm-up)
        # was seen past 1.5 s, and what is tested is the stalled call's end
        warm = Pruner.connect(f"127.0.0.1:{proxy.port}", model, protocol=protocol, timeout=60)
        assert len(warm.prune(QUESTION, many)) == len(many)
        warm.close()
        p = Pruner.connect(
            f"127.0.0.1:{proxy.port}", model, protocol=protocol, timeout=timeout, retries=3, backoff=0.3
        )
        proxy.stall.set()
        worst = 0.0
        for _ in range(reps):
            t0 = time.monotonic()
            with pytest.raises(BackendError):
                p.prune(QUESTION, many)
            worst = max(worst, time.monotonic() - t0)
        assert worst <= timeout + SLACK, f"a call took {worst:.2f} s against a {timeout} s deadline"
        print(f"\n{model} {protocol}: worst call {worst:.2f} s, deadline {timeout} s")
    finally:
        proxy.close()


#: a passage of 1 MB (the issue's case; the limits allow 2,000,000 characters): minutes of
#: model work on 2 cores, in ~500 blocks, far past the deadline on any CPU
LONG = "The quick brown fox jumps over the lazy dog near the river bank. " * 15_400


def test_a_call_past_its_deadline_stops_using_the_workers(default_cache):
    """`prune api --model default --request-timeout 3` (one worker; batches of 2,048 tokens, so
    a batch takes well under a second here): the 1 MB call answers 504 at 3 s, the server
    spends no CPU within a few batches of it and answers the next call; the same through the
    model service (DEADLINE_EXCEEDED, then the next call OK within its own 3 s)."""
    pytest.importorskip("grpc_tools", reason="the model service needs grpcio-tools ([model-service])")
    import httpx

    (grpc_port,) = free_ports(1)
    api = ApiProcess(
        "default",
        "--request-timeout",
        "3",
        "--max-batch-tokens",
        "2048",
        "--model-service-port",
        str(grpc_port),
        env=default_cache["env"],
    )
    try:
        t0 = time.monotonic()
        late = httpx.post(
            f"{api.url}/v1/prune", json={"question": "What does the fox do?", "passages": [LONG]}, timeout=60
        )
        took = time.monotonic() - t0
        assert late.status_code == 504 and 3 <= took < 3 + 2, (late.status_code, took, late.text[:300])
        idle = idle_within(api.proc.pid, 5)
        assert idle is not None, "the abandoned call kept the server busy for 5 s past its 504"
        good = httpx.post(
            f"{api.url}/v1/prune", json={"question": QUESTION, "passages": PASSAGES[:2]}, timeout=60
        )
        assert good.status_code == 200, good.text
        print(f"\nHTTP: 504 at {took:.1f} s, idle {idle:.1f} s later")
        highlight = {"rpc": "Highlight", "query": "What does the fox do?", "params": {}}
        t0 = time.monotonic()
        late, ok = milvus_calls(
            f"127.0.0.1:{grpc_port}",
            [{**highlight, "documents": [LONG]}, {**highlight, "documents": PASSAGES[:2]}],
        )
        assert late["code"] == "DEADLINE_EXCEEDED" and ok["code"] == "OK", (late, ok)
        assert idle_within(api.proc.pid, 5) is not None
        print(f"gRPC: DEADLINE_EXCEEDED, then OK, in {time.monotonic() - t0:.1f} s")
    finally:
        api.close()
