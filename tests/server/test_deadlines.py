"""A server that stops answering (behind a stalling proxy) never holds a call past its
deadline: each `prune()` returns, with a clear error, within `timeout` (retries and
backoff included), over gRPC and HTTP, for the text model and the core model."""
import socket
import threading
import time

import pytest

from engine.errors import BackendError
from engine.pruner import Pruner
from tests.utils import PASSAGES, QUESTION

pytestmark = pytest.mark.server

SLACK = 0.75   # seconds of scheduling noise allowed past the deadline


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


@pytest.mark.parametrize("model, protocol, reps", [("opensearch_text", "grpc", 8), ("opensearch_text", "http", 6),
                                                   ("opensearch", "grpc", 6)])
def test_stalled_server_calls_end_within_their_deadline(server, model, protocol, reps):
    port = int((server.grpc_url if protocol == "grpc" else server.http_url).rsplit(":", 1)[1])
    proxy = StallingProxy(port)
    try:
        timeout = 1.5
        p = Pruner.connect(f"127.0.0.1:{proxy.port}", model, protocol=protocol, timeout=timeout, retries=3,
                           backoff=0.3)
        many = PASSAGES + [f"Passage {i}. About item {i}." for i in range(40)]   # several requests per call
        assert len(p.prune(QUESTION, many)) == len(many)
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
