"""deploy/kubernetes: every core-API manifest is valid against the Kubernetes schema
(kubernetes-validate, strict: unknown fields fail), and the manifests agree with the code:
ports with `prune serve`'s and `prune api`'s, probes with engine.triton.server's and
engine.remote.probe's, model names with what
`prune repository` writes, the restricted admin APIs with `prune serve`'s, the Triton image
with the tritonclient pin."""

import re
from pathlib import Path

import pytest
import yaml

from engine.cli import build_parser
from engine.triton.server import ADMIN_APIS, ADMIN_HEADER, HEALTH_READY
from export.triton_repository import TEXT_SUFFIX

pytestmark = pytest.mark.inprocess

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.32.0"
CORE_APIS = ("v1", "apps/v1", "policy/v1", "autoscaling/v2")


def _docs():
    out = []
    for f in sorted(DEPLOY.glob("*.yaml")):
        out += [(f.name, d) for d in yaml.safe_load_all(f.read_text()) if d]
    return out


def _one(kind, name=None):
    found = [d for _, d in _docs() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def _serve_default(option):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["serve"]
    return next(a.default for a in sub._actions if option in a.option_strings)


@pytest.mark.parametrize(
    "name,doc",
    [p for p in _docs() if p[1]["apiVersion"] in CORE_APIS],
    ids=lambda v: v if isinstance(v, str) else v.get("kind"),
)
def test_core_manifests_are_valid(name, doc):
    import kubernetes_validate

    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_file_is_listed_in_the_kustomization():
    listed = set(yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"])
    assert listed == {f.name for f in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}


def _serve_api_default(option):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["api"]
    return next(a.default for a in sub._actions if option in a.option_strings)


def test_manifests_match_the_code():
    dep = _one("Deployment", "prune-triton")
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    c, api = pod["spec"]["containers"]
    assert (c["name"], api["name"]) == ("tritonserver", "api")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    # Triton's HTTP endpoint is not a container port: it listens on the pod's loopback only
    assert ports == {"grpc": _serve_default("--grpc-port"), "metrics": _serve_default("--metrics-port")}
    args = c["args"]
    assert f"--http-port={_serve_default('--http-port')}" in args and "--http-address=127.0.0.1" in args
    for flag, port in (("--grpc-port", "grpc"), ("--metrics-port", "metrics")):
        assert f"{flag}={ports[port]}" in args
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
    startup = " ".join(c["startupProbe"]["exec"]["command"])
    assert f"http://127.0.0.1:{_serve_default('--http-port')}{HEALTH_READY}" in startup
    # liveness: a real inference through the text model (a dead stub keeps Triton "ready")
    live = c["livenessProbe"]["exec"]["command"]
    assert live[:3] == ["python3", "-m", "engine.remote.probe"]
    assert live[live.index("--url") + 1] == f"127.0.0.1:{ports['grpc']}"
    from engine.remote.probe import main as probe_main

    with pytest.raises(SystemExit) as parsed:  # the probe takes exactly these flags
        probe_main([*live[3:], "--help"])
    assert parsed.value.code == 0
    # the API container: the same image, prune api in front of the text model over loopback gRPC
    assert api["image"] == c["image"]
    cmd = api["command"]
    assert cmd[:2] == ["prune", "api"] and cmd[cmd.index("--server") + 1] == f"127.0.0.1:{ports['grpc']}"
    api_port = {p["name"]: p["containerPort"] for p in api["ports"]}["api"]
    assert api_port == int(cmd[cmd.index("--port") + 1]) == _serve_api_default("--port")
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert api["readinessProbe"]["httpGet"] == {"path": "/health", "port": "api"}
    assert api["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "api"}
    api_env = {e["name"]: e for e in api["env"]}
    assert api_env["PRUNE_API_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is True
    # the text model both containers name: what `prune repository` writes by default
    assert api_env["PRUNE_TEXT_MODEL"]["value"] == "default" + TEXT_SUFFIX
    # what prune serve passes: no model control, strict readiness, admin APIs behind the key
    assert "--model-control-mode=none" in args and "--strict-readiness=true" in args
    rule = f"{','.join(ADMIN_APIS)}:{ADMIN_HEADER}=$(PRUNE_ADMIN_KEY)"
    assert f"--http-restricted-api={rule}" in args and f"--grpc-restricted-protocol={rule}" in args
    env = {e["name"]: e for e in c["env"]}
    assert env["PRUNE_TEXT_MODEL"]["value"] == api_env["PRUNE_TEXT_MODEL"]["value"]
    assert env["PRUNE_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "prune-admin-key"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    # the volume the repository comes from
    claim = {v["name"]: v for v in pod["spec"]["volumes"]}["models"]["persistentVolumeClaim"]["claimName"]
    assert _one("PersistentVolumeClaim")["metadata"]["name"] == claim
    assert (
        env["MODEL_REPOSITORY"]["value"] == {m["name"]: m for m in c["volumeMounts"]}["models"]["mountPath"]
    )
    ports["api"] = api_port

    services = {d["metadata"]["name"]: d for _, d in _docs() if d["kind"] == "Service"}
    assert services["prune-triton-headless"]["spec"]["clusterIP"] == "None"
    for svc in services.values():
        assert svc["spec"]["selector"].items() <= labels.items()
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports and p["port"] == ports[p["targetPort"]]
    assert {p["name"] for p in services["prune-triton-headless"]["spec"]["ports"]} == {"grpc"}
    assert _one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    monitor = _one("PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_autoscaling_targets_the_models_prune_repository_writes():
    scaled = _one("ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "prune-triton"
    assert scaled["spec"]["minReplicaCount"] >= 2  # the PDB lets one go: one stays serving
    models = set()
    for t in scaled["spec"]["triggers"]:
        assert t["type"] == "prometheus"
        q = t["metadata"]["query"]
        assert "nv_inference_queue_duration_us" in q and "nv_inference_request_success" in q
        models |= set(re.findall(r'model="([^"]+)"', q))
    # `prune repository` with no --model/--name writes `default` and `default` + TEXT_SUFFIX
    assert models == {"default", "default" + TEXT_SUFFIX}


def test_dockerfile_matches_the_client_pin():
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    image = re.search(r"^FROM nvcr\.io/nvidia/tritonserver:(\d+)\.(\d+)-py3$", text, re.M)
    assert image, "the Dockerfile must start from NVIDIA's Triton image"
    from engine.bench.runs import TRITON_RELEASE

    # Triton releases: container YY.MM carries server 2.N with N = 51 for 24.10, one per month
    year, month = int(image.group(1)), int(image.group(2))
    assert f"2.{51 + (year - 24) * 12 + (month - 10)}.0" == TRITON_RELEASE
    # the perf_analyzer install docs/installing.md gives is that release's client
    assert f"tritonclient=={TRITON_RELEASE}" in (ROOT / "docs" / "installing.md").read_text()
    assert 'ENTRYPOINT ["tritonserver"]' in text
    dep = _one("Deployment", "prune-triton")
    assert "command" not in dep["spec"]["template"]["spec"]["containers"][0]  # the image's entrypoint
    assert (
        "[api,triton]" in text and "engine.remote.probe" in text
    )  # what the API container and the probe need
