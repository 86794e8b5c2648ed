"""A real inference through a served text model, as a health probe:

    python -m engine.remote.probe --url 127.0.0.1:8001 --model default_text

Exit 0 when the model answered, 1 (and why, on stderr) when it did not. Triton keeps a
model whose python-backend stub died "ready" while it fails every request, so its own
`/v2/health/*` cannot see that; this can. deploy/kubernetes runs it as the tritonserver
container's liveness probe (a dead stub: the container is restarted), beside the HTTP
API's `/health` as the pod's readiness (the same inference, through the API)."""

from __future__ import annotations

import argparse
import sys

from engine.settings import help_text, setting

#: the probe's call: tiny, the same as the HTTP API's /health
QUESTION, PASSAGES = "Is the engine up?", ["The engine is up."]


def probe(url: str, model: str, timeout: float) -> str | None:
    """None when the model answered, else why not."""
    from engine.remote.connect import connect

    try:
        pruner = connect(url, model, timeout=timeout, retries=0, ready_timeout=timeout)
        try:
            pruner.prune(QUESTION, PASSAGES)
        finally:
            pruner.close()
    except Exception as exc:  # every failure is an answer here: the probe says which
        return f"{type(exc).__name__}: {exc}"[:500]
    return None


def main(argv: list[str] | None = None) -> int:
    """`python -m engine.remote.probe`: exit 0 when a real inference through the text model answers."""
    p = argparse.ArgumentParser(
        prog="python -m engine.remote.probe", description=__doc__.split("\n\n")[0].rstrip(":") + "."
    )
    p.add_argument(
        "--url", default="127.0.0.1:8001", help="the server's gRPC address (default 127.0.0.1:8001)"
    )
    p.add_argument("--model", default=setting("text_model") or "default_text", help=help_text("text_model"))
    p.add_argument("--timeout", type=float, default=5.0, help="seconds the call may take (default 5)")
    args = p.parse_args(argv)
    why = probe(args.url, args.model, args.timeout)
    if why:
        print(f"{args.model}@{args.url}: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
