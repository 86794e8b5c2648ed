"""Several replicas behind one Pruner: three real tritonservers on loopback, a bounded load
from several clients (each checks every result against in-process), one server killed
mid-run and started again. Nothing lost, duplicated or mixed; no caller sees an error;
the restarted replica is taken back and receives traffic again."""

import threading
import time

import numpy as np
import pytest

from engine.errors import BackendError, ModelLoadError
from engine.pruner import Pruner
from engine.triton.replicas import is_replicated, parse_endpoints, resolve
from tests.utils import free_ports

pytestmark = pytest.mark.server

NAME = "hl"


@pytest.fixture(scope="module")
def replica_repository(exported, tmp_path_factory):
    from export.triton_repository import RepositoryOptions, build_repository

    repo = tmp_path_factory.mktemp("replica_repo")
    build_repository(
        exported["provence"],
        repo,
        RepositoryOptions(target="cpu", name=NAME, max_batch_size=8, text_instances=1, intra_op_threads=1),
        log=lambda m: None,
    )
    return repo


@pytest.fixture(scope="module")
def servers(replica_repository):
    from engine.triton.server import TritonServer

    servers = [
        TritonServer(replica_repository, http_port=h, grpc_port=g, metrics_port=m)
        for h, g, m in (free_ports(3) for _ in range(3))
    ]
    threads = [threading.Thread(target=s.start, kwargs={"timeout": 180}) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(s.ready() for s in servers)
    yield servers
    for s in servers:
        s.stop(timeout=10)


def _accepts(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _queries(n):
    rng = np.random.default_rng(7)
    words = "lamb potato oven pie bottom layer cheese beef onion carrot gravy crust".split()
    out = []
    for q in range(n):
        passages = [
            " ".join(f"{' '.join(rng.choice(words, 6))} number {q}-{p}-{k}." for k in range(1 + p % 4))
            for p in range(1 + q % 5)
        ]
        out.append((f"what is in pie {q}?", passages))
    return out


def _same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.index == w.index
        assert [s.text for s in g.sentences] == [s.text for s in w.sentences]
        assert [s.kept for s in g.sentences] == [s.kept for s in w.sentences]
        assert np.allclose(
            [s.probability for s in g.sentences], [s.probability for s in w.sentences], atol=1e-5
        )
        assert g.pruned_context == w.pruned_context


def test_endpoints_are_parsed_and_resolved():
    assert parse_endpoints("a:1,b:2") == (["a:1", "b:2"], None)
    assert parse_endpoints(["a:1", "b:2"])[0] == ["a:1", "b:2"]
    assert is_replicated(["a:1"]) and is_replicated("a:1,b:2") and is_replicated("dns:///a:1")
    assert not is_replicated("a:1")
    assert resolve("localhost:8001") == ["127.0.0.1:8001"]  # one address family: no double counting
    with pytest.raises(ModelLoadError):
        parse_endpoints("a:1,a:1")
    with pytest.raises(ModelLoadError):
        parse_endpoints("nohostport")


def test_http_is_refused_for_several_endpoints(servers):
    with pytest.raises(ModelLoadError, match="grpc"):
        Pruner.connect([s.http_url for s in servers], f"{NAME}_text", protocol="http")


def test_no_replica_ready_is_a_clear_error():
    a, b = free_ports(2)
    with pytest.raises(BackendError, match="no replica"):
        Pruner.connect([f"127.0.0.1:{a}", f"127.0.0.1:{b}"], f"{NAME}_text", ready_timeout=1)


def test_failover_under_load(servers, exported, capsys):
    local = Pruner.load(exported["provence"])
    queries = _queries(24)
    expected = [local.prune(q, p) for q, p in queries]
    endpoints = [s.grpc_url for s in servers]
    options = {"health_interval": 0.25}
    text = Pruner.connect(endpoints, f"{NAME}_text", timeout=60, replica_options=options)
    core = Pruner.connect(",".join(endpoints), NAME, timeout=60, replica_options=options)
    stop = threading.Event()
    calls, errors, mismatches = [0], [], []
    lock = threading.Lock()

    def client(pruner, offset):
        k = offset
        while not stop.is_set():
            q, p = queries[k % len(queries)]
            try:
                got = pruner.prune(q, p)
                _same(got, expected[k % len(queries)])
            except AssertionError as exc:
                mismatches.append(f"{q}: {exc}")
            except Exception as exc:  # what a caller would see
                errors.append(repr(exc))
            with lock:
                calls[0] += 1
            k += 1

    threads = [
        threading.Thread(target=client, args=(pr, i * 5)) for i, pr in enumerate([text, text, core, core])
    ]
    for t in threads:
        t.start()
    try:
        time.sleep(3)
        victim = servers[1]
        before = (
            text.transport.stats()[victim.grpc_url]["served"]
            + core.backend.transport.stats()[victim.grpc_url]["served"]
        )
        assert before > 0, "the load did not reach every replica"
        victim.kill()  # a crash: no drain, in-flight requests cut
        calls_at_kill = calls[0]
        time.sleep(3)
        assert not text.transport.stats()[victim.grpc_url]["ready"]
        victim.start(timeout=180)
        back_up = time.monotonic()  # its HTTP endpoint is ready
        while not _accepts(victim.grpc_port) and time.monotonic() < back_up + 30:
            time.sleep(0.02)
        grpc_up = time.monotonic()  # its gRPC port accepts connections (here 1-3 s later)
        deadline = back_up + 30
        while time.monotonic() < deadline and not (
            text.transport.stats()[victim.grpc_url]["ready"]
            and core.backend.transport.stats()[victim.grpc_url]["ready"]
        ):
            time.sleep(0.02)
        readmit, grpc_delay = time.monotonic() - grpc_up, grpc_up - back_up
        readmitted_served = [
            text.transport.stats()[victim.grpc_url]["served"],
            core.backend.transport.stats()[victim.grpc_url]["served"],
        ]
        time.sleep(3)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    stats = {"text": text.transport.stats(), "core": core.backend.transport.stats()}
    after = [
        text.transport.stats()[victim.grpc_url]["served"],
        core.backend.transport.stats()[victim.grpc_url]["served"],
    ]
    text.close()
    core.close()
    with capsys.disabled():
        print(
            f"\nfailover: {calls[0]} calls ({calls[0] - calls_at_kill} after the kill), {len(errors)} errors, "
            f"{len(mismatches)} wrong results; re-admitted {readmit:.2f} s after the restarted server's gRPC port "
            f"accepted connections ({grpc_delay:.2f} s after its HTTP readiness); "
            f"restarted replica served {after[0] - readmitted_served[0]} text and "
            f"{after[1] - readmitted_served[1]} core requests after it"
        )
        for kind, st in stats.items():
            print(
                f"  {kind}: "
                + "; ".join(
                    f"{e} served {v['served']} failed-over {v['failed']} removals {v['removals']}"
                    for e, v in st.items()
                )
            )
    assert not errors, errors[:5]
    assert not mismatches, mismatches[:5]
    assert readmit < 5, f"the restarted replica was taken back only {readmit:.1f} s after its port opened"
    assert after[0] > readmitted_served[0] and after[1] > readmitted_served[1], (
        "the restarted replica received no traffic"
    )
    assert stats["text"][victim.grpc_url]["removals"] >= 1
