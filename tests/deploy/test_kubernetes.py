"""deploy/kubernetes: every manifest validates against Kubernetes' schemas (strict: an
unknown field fails), the Envoy bootstrap in its ConfigMap is what `sluicegate bootstrap`
prints for the command it names, and the pieces agree with each other (addresses, the
config, the admin socket); no secret is written inline; every container runs non-root
on a read-only root filesystem with probes and resource requests."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sluicegate.envoy import find_envoy_binary
from tests.deploy.artifacts import KUBERNETES, manifest, manifests
from tests.deploy.bootstrap_configmap import (
    BOOTSTRAP_MANIFEST,
    COMMAND,
    COMMAND_ANNOTATION,
    DATA_KEY,
    render,
    run_bootstrap,
)

# Native sidecars (init containers with restartPolicy: Always) need 1.29; and the newest
# schemas the package has.
KUBERNETES_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
README = KUBERNETES.parent / "README.md"


def _pod(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = manifest("Deployment", name)["spec"]["template"]["spec"]
    return spec


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in _containers(pod) if c["name"] == name]
    return found


def _flag(args: list[str], name: str) -> str:
    """The value of `--name=value` or `--name value` in args."""
    for index, arg in enumerate(args):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}":
            return args[index + 1]
    raise AssertionError(f"--{name} not in {args}")


def _bootstrap_args() -> list[str]:
    annotations = manifest("ConfigMap", "sluicegate-envoy-bootstrap")["metadata"]["annotations"]
    return shlex.split(annotations[COMMAND_ANNOTATION])


def _config() -> dict[str, Any]:
    text = manifest("ConfigMap", "sluicegate-config")["data"]["sluicegate.yaml"]
    document: dict[str, Any] = yaml.safe_load(text)
    return document


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schemas(version: str) -> None:
    found = manifests()
    assert {m["kind"] for _, m in found} >= {
        "Namespace", "ConfigMap", "Deployment", "Service", "NetworkPolicy"
    }  # fmt: skip
    for path, document in found:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{path.name}: {document['kind']} {document['metadata']['name']}: {err}")


def test_the_bootstrap_configmap_is_what_sluicegate_bootstrap_prints() -> None:
    annotations = manifest("ConfigMap", "sluicegate-envoy-bootstrap")["metadata"]["annotations"]
    command = annotations[COMMAND_ANNOTATION]
    data = manifest("ConfigMap", "sluicegate-envoy-bootstrap")["data"][DATA_KEY]
    regenerate = "run `.venv/bin/python -m tests.deploy.bootstrap_configmap`"
    assert data.rstrip("\n") == run_bootstrap(command).rstrip("\n"), f"stale: {regenerate}"
    # The whole file, comments and the command included, is what the generator writes,
    # and README documents the same command.
    assert command == COMMAND
    assert BOOTSTRAP_MANIFEST.read_text() == render(), regenerate
    assert COMMAND in " ".join(README.read_text().replace("\\\n", " ").split())


def test_envoy_accepts_the_bootstrap_with_the_manifests_arguments(tmp_path: Path) -> None:
    """`envoy --mode validate`, with the sidecar's own arguments (its bootstrap path
    swapped for a copy of the ConfigMap's, its pod name filled in)."""
    envoy = _container(_pod("example-app"), "envoy")
    assert envoy["command"] == ["envoy"]
    bootstrap = tmp_path / "bootstrap.yaml"
    bootstrap.write_text(manifest("ConfigMap", "sluicegate-envoy-bootstrap")["data"][DATA_KEY])
    args = [
        str(bootstrap) if arg == "/etc/envoy/bootstrap.yaml" else arg.replace("$(POD_NAME)", "p-1")
        for arg in envoy["args"]
    ]
    assert str(bootstrap) in args
    done = subprocess.run(
        [find_envoy_binary(), "--mode", "validate", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_config_is_valid_and_names_only_keys_the_control_plane_gets(tmp_path: Path) -> None:
    config = _config()
    control_plane = _container(_pod("sluicegate-control-plane"), "control-plane")
    from_secrets = {
        env["name"]: env["valueFrom"]["secretKeyRef"]["name"]
        for env in control_plane["env"]
        if "secretKeyRef" in env.get("valueFrom", {})
    }
    named = {p["api_key"]["env"] for p in config["providers"] if "env" in p.get("api_key", {})}
    assert named and named <= from_secrets.keys(), (named, from_secrets)
    assert set(from_secrets.values()) == {"sluicegate-provider-keys"}
    path = tmp_path / "sluicegate.yaml"
    path.write_text(manifest("ConfigMap", "sluicegate-config")["data"]["sluicegate.yaml"])
    env = {**os.environ, **{name: f"sk-test-{name.lower()}" for name in named}}
    done = subprocess.run([sys.executable, "-m", "sluicegate", "validate", str(path)],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_pieces_agree_on_addresses() -> None:
    config = _config()
    bootstrap = _bootstrap_args()
    control_plane = _container(_pod("sluicegate-control-plane"), "control-plane")
    app_pod = _pod("example-app")
    ext_proc = _container(app_pod, "ext-proc")
    envoy = _container(app_pod, "envoy")
    service = manifest("Service", "sluicegate-control-plane")

    # Envoy's ext_proc clusters name the pod's own ext_proc sidecar.
    assert _flag(bootstrap, "ext-proc") == _flag(ext_proc["args"], "address")
    assert _flag(ext_proc["args"], "address") == config["sluicegate"]["ext_proc"]
    # Envoy's xDS cluster names the control plane's Service, on its xDS port.
    host, port = _flag(bootstrap, "control-plane").rsplit(":", 1)
    namespace = service["metadata"]["namespace"]
    assert host == f"{service['metadata']['name']}.{namespace}.svc.cluster.local"
    (xds,) = [p for p in service["spec"]["ports"] if p["name"] == "xds"]
    assert int(port) == xds["port"]
    assert _flag(control_plane["args"], "xds") == config["sluicegate"]["xds"]
    assert _flag(control_plane["args"], "xds").endswith(f":{xds['port']}")
    # The admin socket is where the config says, in a volume the Envoy container mounts.
    admin = _flag(bootstrap, "admin")
    assert admin == config["sluicegate"]["envoy_admin"]
    socket_dir = str(Path(admin.removeprefix("unix:")).parent)
    assert socket_dir in {m["mountPath"] for m in envoy["volumeMounts"]}
    # Every Deployment is in the namespace the ConfigMaps are in.
    for _, document in manifests():
        if document["kind"] != "Namespace":
            assert document["metadata"]["namespace"] == namespace
    # The app calls the sidecar listener.
    (listener,) = config["listeners"]
    assert listener["address"] == "127.0.0.1"
    app_env = {e["name"]: e.get("value") for e in _container(app_pod, "app")["env"]}
    assert app_env["OPENAI_BASE_URL"] == f"http://127.0.0.1:{listener['port']}/v1"


def test_no_secret_is_inline() -> None:
    for path, document in manifests():
        assert document["kind"] != "Secret", f"{path.name}: secrets are made with kubectl"
        if document["kind"] != "Deployment":
            continue
        for container in _containers(document["spec"]["template"]["spec"]):
            for env in container.get("env", []):
                if "KEY" in env["name"] or "TOKEN" in env["name"] or "SECRET" in env["name"]:
                    assert "secretKeyRef" in env.get("valueFrom", {}), (path.name, env)
            assert not any("sk-" in arg for arg in container.get("args", [])), path.name


def test_containers_are_locked_down_with_probes_and_requests() -> None:
    for name in ("sluicegate-control-plane", "example-app"):
        pod = _pod(name)
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert pod["automountServiceAccountToken"] is False, name
        for container in _containers(pod):
            where = f"{name}/{container['name']}"
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            assert {"cpu", "memory"} <= container["resources"]["requests"].keys(), where
            assert "memory" in container["resources"]["limits"], where
            if container["image"].startswith("sluicegate:"):
                assert "livenessProbe" in container and "readinessProbe" in container, where
    # The sidecars start before the app and stop after it.
    app_pod = _pod("example-app")
    assert [c["name"] for c in app_pod["initContainers"]] == ["ext-proc", "envoy"]
    for sidecar in app_pod["initContainers"]:
        assert sidecar["restartPolicy"] == "Always"
        assert "startupProbe" in sidecar


def _dockerfile_library_step() -> str:
    """The Dockerfile's RUN line that builds the native filters library, joined."""
    text = (KUBERNETES.parent / "Dockerfile").read_text().replace("\\\n", " ")
    (step,) = [line for line in text.splitlines() if "native-build" in line]
    return " ".join(step.removeprefix("RUN ").split())


def test_the_image_builds_the_library_where_the_bootstrap_names_it(tmp_path: Path) -> None:
    """The Dockerfile's library step, run here with the image's /opt/sluicegate as a
    temporary folder: the path the sidecar's bootstrap names is a library built from
    these sources, which the control plane (native_filters.module: node) then serves."""
    named = _flag(_bootstrap_args(), "native-module")
    step = _dockerfile_library_step()
    assert named in step.split(), step
    prefix = "/opt/sluicegate"
    assert named.startswith(prefix + "/")
    here = step.replace(f"{prefix}/bin/sluicegate", f"{shlex.quote(sys.executable)} -m sluicegate")
    done = subprocess.run(
        ["sh", "-c", here.replace(prefix, str(tmp_path))],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    from sluicegate.native import MODULE, build

    library = tmp_path / named.removeprefix(prefix + "/")
    assert library.resolve() == build(MODULE, library.parent)
    assert "native_filters" not in _config()  # the default, node: the bootstrap decides
