"""What the Kubernetes manifests (deploy/k8s) say a pod runs, read the way the kubelet reads it, for
the tests that run those pods' containers here: tests/k8s_manifest_test.py (the binaries of the
build tree) and tests/container_test.py (the image)."""
import base64
import os
import re
import subprocess

import yaml


def render(source, overlay):
    """Every object of an overlay, by (kind, name), as `kubectl kustomize` renders it."""
    out = subprocess.run(["kubectl", "kustomize", os.path.join(source, "deploy/k8s/overlays", overlay)],
                         capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def expand(arg, env):
    """Kubernetes' $(VAR) expansion of container args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)


def flag(args, name):
    """The value of --name=VALUE in args (the last one, as absl takes it), or None."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return values[-1] if values else None


def make_secrets(source, directory):
    """The Secrets scripts/k8s-secrets.sh prints, by name, with their data decoded."""
    out = subprocess.run([os.path.join(source, "scripts/k8s-secrets.sh"), directory],
                         capture_output=True, text=True, check=True).stdout
    return {d["metadata"]["name"]: {**d, "files": {k: base64.b64decode(v) for k, v in d["data"].items()}}
            for d in yaml.safe_load_all(out) if d}


def pod_volumes(pod_spec, container, secrets, root, node=None):
    """Writes what the kubelet would mount for `container` under root (root + mountPath) and
    returns {mountPath: directory}: a Secret's keys (its items only, when listed; a missing key
    fails, as the kubelet's mount does) with the volume's mode; an empty directory for a claim;
    for a hostPath, the one directory node + path that every pod of this node shares (a hostPath
    without `node` fails: the test must say which node the pod is on)."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    mounts = {}
    for m in container.get("volumeMounts", []):
        volume = volumes.get(m["name"])
        if volume is not None and "hostPath" in volume:
            if node is None:
                raise AssertionError(f"volume {m['name']} is a hostPath: the pod needs a node")
            directory = node + volume["hostPath"]["path"]
            os.makedirs(directory, exist_ok=True)
            mounts[m["mountPath"]] = directory
            continue
        directory = root + m["mountPath"]
        os.makedirs(directory)
        if volume is not None and "secret" in volume:
            source = volume["secret"]
            data = secrets[source["secretName"]]["files"]
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                if item["key"] not in data:
                    raise AssertionError(f"Secret {source['secretName']} has no key {item['key']}")
                path = os.path.join(directory, item["path"])
                with open(path, "wb") as f:
                    f.write(data[item["key"]])
                os.chmod(path, item.get("mode", source.get("defaultMode", 0o644)))
        mounts[m["mountPath"]] = directory
    return mounts


def to_host(arg, mounts, ports):
    """One container arg as it runs on this host: listen addresses on 127.0.0.1 with an
    OS-chosen port (`ports` names the flags to map), paths inside a volume inside its directory."""
    name, _, value = arg.partition("=")
    if name[2:] in ports and re.fullmatch(r"(0\.0\.0\.0|127\.0\.0\.1):\d+", value):
        return f"{name}=127.0.0.1:0"
    for mount_path, directory in mounts.items():
        if value == mount_path or value.startswith(mount_path + "/"):
            return f"{name}={directory}{value[len(mount_path):]}"
    return arg


def health_check(target, service="", credentials=None, target_name=None):
    """grpc.health.v1.Health/Check, spelled in bytes (field 1 of each message): the serving
    status (1 SERVING, 2 NOT_SERVING), or the gRPC error code's name."""
    import grpc  # only the runs need it
    options = [("grpc.ssl_target_name_override", target_name)] if target_name else []
    channel = (grpc.secure_channel(target, credentials, options) if credentials
               else grpc.insecure_channel(target))
    with channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        request = b"\x0a" + bytes([len(service)]) + service.encode() if service else b""
        try:
            reply = check(request, timeout=5)
        except grpc.RpcError as e:
            return e.code().name
        return {b"": 0, b"\x08\x01": 1, b"\x08\x02": 2}.get(reply, reply)
