"""A client of Milvus's model service that calls as Milvus's own Go client does
(internal/util/function/models/zilliz/zilliz_client.go), run in a process of its own:

    python -m tests.server.milvus_client HOST:PORT < calls.json > answers.json

Its stubs are generated now, by grpcio-tools' protoc, from the proto the engine vendors
(engine/http/proto/model_service.proto), into a temporary folder: nothing of the server's
code is imported. Like Milvus it dials plaintext with gzip on every call, 100 MiB message
limits and 30 s keepalive pings, sends the `instance-id`, `model-deployment-id` and
`db-name` metadata and no `model`, and gives each call a 30 s deadline.

Each call of the JSON list on stdin is `{"rpc": "Highlight"|"Rerank"|"Embedding", "query",
"documents" (or "texts"), "params": {str: str}, "metadata": [[k, v], ...] (added)}`; each
answer on stdout is `{"code": "OK"|<status code name>, "details", ...}` with `results`
(Highlight: sentences, scores), `scores` (Rerank) or `dense` (Embedding: each vector's
bytes read as little-endian float32, as Milvus reads them, and `dtype`, `dim`), and
`status` (the response's Status).
"""

from __future__ import annotations

import importlib
import json
import struct
import sys
import tempfile
from pathlib import Path

PROTO = Path(__file__).resolve().parents[2] / "engine" / "http" / "proto" / "model_service.proto"
MIB = 1024 * 1024


def stubs(folder: Path):
    """(messages, services) modules generated from the vendored proto into `folder`."""
    from grpc_tools import protoc
    import grpc_tools

    include = str(Path(grpc_tools.__file__).parent / "_proto")
    (folder / "model_service.proto").write_bytes(PROTO.read_bytes())
    rc = protoc.main(
        [
            "protoc",
            f"-I{folder}",
            f"-I{include}",
            f"--python_out={folder}",
            f"--grpc_python_out={folder}",
            str(folder / "model_service.proto"),
        ]
    )
    if rc != 0:
        raise SystemExit(f"protoc failed on {PROTO} ({rc})")
    sys.path.insert(0, str(folder))
    return importlib.import_module("model_service_pb2"), importlib.import_module("model_service_pb2_grpc")


def answer(pb, stubs_by_rpc, call: dict) -> dict:
    import grpc

    rpc = call["rpc"]
    metadata = [("instance-id", "by-dev"), ("model-deployment-id", ""), ("db-name", "")]
    metadata += [tuple(kv) for kv in call.get("metadata", [])]
    params = call.get("params", {})
    if rpc == "Highlight":
        request = pb.HighlightRequest(query=call["query"], documents=call["documents"], params=params)
    elif rpc == "Rerank":
        request = pb.TextRerankRequest(query=call["query"], documents=call["documents"], params=params)
    else:
        request = pb.TextEmbeddingRequest(texts=call["texts"], params=params)
    try:
        response = stubs_by_rpc[rpc](
            request, metadata=metadata, timeout=30.0, compression=grpc.Compression.Gzip
        )
    except grpc.RpcError as exc:
        return {"code": exc.code().name, "details": exc.details()}
    out = {"code": "OK", "details": "", "status": {"code": response.status.code, "msg": response.status.msg}}
    if rpc == "Highlight":
        out["results"] = [
            {"sentences": list(r.sentences), "scores": list(r.scores)} for r in response.results
        ]
    elif rpc == "Rerank":
        out["scores"] = list(response.scores)
    else:
        out["dense"] = [
            list(struct.unpack(f"<{len(r.dense.data) // 4}f", r.dense.data)) for r in response.results
        ]
        out["dtype"] = [r.dense.dtype for r in response.results]
        out["dim"] = [r.dense.dim for r in response.results]
    return out


def main(address: str) -> int:
    import grpc

    with tempfile.TemporaryDirectory() as tmp:
        pb, services = stubs(Path(tmp))
        options = [
            ("grpc.max_receive_message_length", 100 * MIB),
            ("grpc.max_send_message_length", 100 * MIB),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
        with grpc.insecure_channel(address, options=options, compression=grpc.Compression.Gzip) as channel:
            by_rpc = {
                "Highlight": services.HighlightServiceStub(channel).Highlight,
                "Rerank": services.RerankServiceStub(channel).Rerank,
                "Embedding": services.TextEmbeddingServiceStub(channel).Embedding,
            }
            answers = [answer(pb, by_rpc, call) for call in json.load(sys.stdin)]
    json.dump(answers, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
