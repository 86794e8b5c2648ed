"""deploy/kubernetes: every core-API manifest is valid against the Kubernetes schema
(kubernetes-validate, strict: unknown fields fail), and the manifests agree with the code:
ports with `prune serve`'s, probe paths with engine.triton.server's, model names with what
`prune repository` writes, the restricted admin APIs with `prune serve`'s, the Triton image
with the tritonclient pin."""
import re
from pathlib import Path

import pytest
import yaml

from engine.cli import build_parser
from engine.triton.server import ADMIN_APIS, ADMIN_HEADER, HEALTH_LIVE, HEALTH_READY
from export.triton import TEXT_SUFFIX

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.mark.parametrize("name,doc", [p for p in _docs() if p[1]["apiVersion"] in CORE_APIS],
                         ids=lambda v: v if isinstance(v, str) else v.get("kind"))
def test_core_manifests_are_valid(name, doc):
    import kubernetes_validate
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_file_is_listed_in_the_kustomization():
    listed = set(yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"])
    assert listed == {f.name for f in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}


def test_manifests_match_the_code():
    dep = _one("Deployment", "prune-triton")
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (c,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": _serve_default("--http-port"), "grpc": _serve_default("--grpc-port"),
                     "metrics": _serve_default("--metrics-port")}
    args = c["args"]
    for flag, port in (("--http-port", "http"), ("--grpc-port", "grpc"), ("--metrics-port", "metrics")):
        assert f"{flag}={ports[port]}" in args
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
    assert c["readinessProbe"]["httpGet"]["path"] == HEALTH_READY
    assert c["startupProbe"]["httpGet"]["path"] == HEALTH_READY
    assert c["livenessProbe"]["httpGet"]["path"] == HEALTH_LIVE
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] == "http"
    # what prune serve passes: no model control, strict readiness, admin APIs behind the key
    assert "--model-control-mode=none" in args and "--strict-readiness=true" in args
    rule = f"{','.join(ADMIN_APIS)}:{ADMIN_HEADER}=$(PRUNE_ADMIN_KEY)"
    assert f"--http-restricted-api={rule}" in args and f"--grpc-restricted-protocol={rule}" in args
    env = {e["name"]: e for e in c["env"]}
    assert env["PRUNE_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "prune-admin-key"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    # the volume the repository comes from
    claim = {v["name"]: v for v in pod["spec"]["volumes"]}["models"]["persistentVolumeClaim"]["claimName"]
    assert _one("PersistentVolumeClaim")["metadata"]["name"] == claim
    assert env["MODEL_REPOSITORY"]["value"] == {m["name"]: m for m in c["volumeMounts"]}["models"]["mountPath"]

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
    assert scaled["spec"]["minReplicaCount"] >= 2      # the PDB lets one go: one stays serving
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
    pin = re.search(r'tritonclient\[[^\]]*\]==2\.(\d+)\.', (ROOT / "pyproject.toml").read_text())
    # Triton releases: container YY.MM carries server 2.N with N = 51 for 24.10, one per month
    year, month = int(image.group(1)), int(image.group(2))
    assert 51 + (year - 24) * 12 + (month - 10) == int(pin.group(1))
    assert "ENTRYPOINT [\"tritonserver\"]" in text
    dep = _one("Deployment", "prune-triton")
    assert "command" not in dep["spec"]["template"]["spec"]["containers"][0]   # the image's entrypoint
