"""Kubernetes manifests: every overlay renders with `kubectl kustomize` and holds what Summa
promises (headless Service, StatefulSet with a checkpoint volume and gRPC probes, indexed worker
Job, ConfigMap, NetworkPolicy, PodDisruptionBudget, one GPU per worker in the gpu overlay, the
Secrets mounted read-only where the flags point, each worker's own rank's token under
components/rank-tokens, server shards on nodes of their own under components/dedicated-servers,
placed as a scheduler would), and the cpu-demo, cpu-demo-sharded, cpu-demo-dedicated-servers,
cpu-demo-tls, cpu-demo-elastic, cpu-demo-rank-tokens and cpu-demo-shm (workers beside the server
on the shared-memory plane) overlays' exact command lines and environment train on this machine: the
binaries run as the containers would, with the Service's DNS name and the listen addresses mapped
to 127.0.0.1 (OS-chosen ports), the completion index as the rank, and each volume mapped to a
directory of its own that holds what the kubelet would put there (the Secrets that
scripts/k8s-secrets.sh prints, with each volume's items and modes). Drift between the manifests,
the Secrets' keys and the binaries' flags fails here."""
import argparse
import base64
import os
import re
import signal
import subprocess
import sys
import tempfile
import unittest

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from k8s_pods import expand, flag, health_check, make_secrets, pod_volumes, render, to_host  # noqa: E402
from grpc_reflect import Reflector  # noqa: E402
from procs import ProcessGroup, wait_until  # noqa: E402

ARGS = None

SERVICE = "summa-server-0.summa-server"  # the server pod's DNS name, in the server's certificate
TOKENS = "summa-tokens"
SERVER_TLS, WORKER_TLS = "summa-server-tls", "summa-worker-tls"
RANK_TOKENS = "summa-rank-tokens"  # components/rank-tokens, scripts/k8s-secrets.sh --rank_tokens=N
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def secrets_script(directory, *flags):
    """scripts/k8s-secrets.sh DIR FLAGS...: its exit status, stdout and stderr."""
    run = subprocess.run([os.path.join(ARGS.source, "scripts/k8s-secrets.sh"), directory, *flags],
                         capture_output=True, text=True)
    return run.returncode, run.stdout, run.stderr


def make_rank_secrets(directory, ranks):
    """k8s_pods.make_secrets with --rank_tokens=ranks: the Secrets by name, their data decoded."""
    rc, out, err = secrets_script(directory, f"--rank_tokens={ranks}")
    if rc != 0:
        raise AssertionError(f"k8s-secrets.sh --rank_tokens={ranks} exited with {rc}:\n{err}")
    return {d["metadata"]["name"]: {**d, "files": {k: base64.b64decode(v) for k, v in d["data"].items()}}
            for d in yaml.safe_load_all(out) if d}


def parse_token_list(text):
    """A server's --token_file as common/rpc/tokens.h reads it: [(token, rank or None)], in file
    order, blank and # lines skipped."""
    listed = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) == 1:
            listed.append((words[0], None))
        else:
            assert len(words) == 2 and re.fullmatch(r"rank=\d+", words[1]), f"not TOKEN or TOKEN rank=R: {line!r}"
            listed.append((words[0], int(words[1][len("rank="):])))
    return listed


def pod_env(container, config, index):
    """What the kubelet expands a container's $(VAR)s from, in pod `index` of an indexed Job: the
    ConfigMap's variables (envFrom), then the container's env; a fieldRef there may only be the
    pod's completion-index annotation (which the Job controller sets to `index`)."""
    env = dict(config)
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            field = e["valueFrom"]["fieldRef"]["fieldPath"]
            assert field == COMPLETION_INDEX, f"env {e['name']}: a fieldRef this test cannot resolve: {field}"
            env[e["name"]] = str(index)
    return env


def schedule(pods, nodes):
    """{pod name: node name or None}: each pod in turn on the first node that a scheduler's hard
    rules admit (nodeSelector, NoSchedule taints against tolerations, required pod anti-affinity
    on kubernetes.io/hostname, the pod's own terms and those of the pods already there), among
    them the nodes its preferred anti-affinity does not count against, where there are any."""
    def labels(pod):
        return pod["metadata"]["labels"]

    def selects(selector, pod):
        for k, v in selector.get("matchLabels", {}).items():
            if labels(pod).get(k) != v:
                return False
        for e in selector.get("matchExpressions", []):
            assert e["operator"] == "In", e
            if labels(pod).get(e["key"]) not in e["values"]:
                return False
        return True

    def anti(pod, kind):
        terms = pod["spec"].get("affinity", {}).get("podAntiAffinity", {}).get(kind, [])
        terms = [t.get("podAffinityTerm", t) for t in terms]
        assert all(t["topologyKey"] == "kubernetes.io/hostname" for t in terms)
        return [t["labelSelector"] for t in terms]

    def admits(node, pod, placed_here):
        spec = pod["spec"]
        if any(node["labels"].get(k) != v for k, v in spec.get("nodeSelector", {}).items()):
            return False
        for t in node["taints"]:
            if not any(tol.get("key") == t["key"] and tol.get("effect") == t["effect"] and
                       (tol.get("operator") == "Exists" or tol.get("value") == t["value"])
                       for tol in spec.get("tolerations", [])):
                return False
        required = "requiredDuringSchedulingIgnoredDuringExecution"
        return not any(selects(sel, other) for other in placed_here for sel in anti(pod, required)) and \
            not any(selects(sel, pod) for other in placed_here for sel in anti(other, required))

    placed, on = {}, {n["name"]: [] for n in nodes}
    for name, pod in pods:
        fits = [n["name"] for n in nodes if admits(n, pod, on[n["name"]])]
        preferred = anti(pod, "preferredDuringSchedulingIgnoredDuringExecution")
        free = [n for n in fits if not any(selects(sel, other) for other in on[n] for sel in preferred)]
        placed[name] = (free or fits or [None])[0]
        if placed[name]:
            on[placed[name]].append(pod)
    return placed


class K8sManifestTest(unittest.TestCase):
    def check_common(self, objs, tls=False, rank_tokens=False):
        svc = objs[("Service", "summa-server")]
        self.assertEqual(svc["spec"]["clusterIP"], "None")
        sts = objs[("StatefulSet", "summa-server")]
        self.assertEqual(sts["spec"]["serviceName"], "summa-server")
        self.assertTrue(sts["spec"]["volumeClaimTemplates"])
        server = sts["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(server["readinessProbe"]["grpc"]["service"], "summa.v1.ParameterServer")
        self.assertIn("limits", server["resources"])
        self.assertEqual(sts["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"],
                         "false" if tls else "true")
        job = objs[("Job", "summa-worker")]
        self.assertEqual(job["spec"]["completionMode"], "Indexed")
        env = objs[("ConfigMap", "summa-job")]["data"]
        self.assertEqual(job["spec"]["completions"], int(env["SUMMA_WORKERS"]))
        self.assertEqual(job["spec"]["template"]["spec"]["restartPolicy"], "OnFailure")
        self.assertIn(("NetworkPolicy", "summa-server"), objs)
        self.assertIn(("PodDisruptionBudget", "summa-server"), objs)
        self.check_tokens(objs, rank_tokens)
        return env

    def mounted(self, pod_spec, container, secret_name):
        """The volume of Secret `secret_name` and its mount in `container`: read-only, the whole
        directory (a subPath mount never sees a rotated Secret), files only the pod's group reads."""
        volumes = [v for v in pod_spec["volumes"] if v.get("secret", {}).get("secretName") == secret_name]
        self.assertEqual(len(volumes), 1, f"one volume of Secret {secret_name}")
        mounts = [m for m in container["volumeMounts"] if m["name"] == volumes[0]["name"]]
        self.assertEqual(len(mounts), 1, f"Secret {secret_name} mounted once")
        self.assertIs(mounts[0].get("readOnly"), True, f"Secret {secret_name} mounted read-only")
        self.assertNotIn("subPath", mounts[0])
        self.assertEqual(volumes[0]["secret"]["defaultMode"], 0o440)
        self.assertEqual(pod_spec["securityContext"]["fsGroup"], pod_spec["securityContext"]["runAsUser"])
        return volumes[0]["secret"], mounts[0]["mountPath"]

    def assertFlagInMount(self, args, name, mount_path, key):
        self.assertEqual(flag(args, name), f"{mount_path}/{key}", f"--{name} reads {key} from its mount")

    def check_tokens(self, objs, rank_tokens=False):
        sts = objs[("StatefulSet", "summa-server")]["spec"]["template"]["spec"]
        secret, path = self.mounted(sts, sts["containers"][0], TOKENS)
        self.assertNotIn("items", secret, "the server reads both tokens")
        # Under components/rank-tokens worker-token is the server's list (a bare token, then one per rank).
        self.assertFlagInMount(sts["containers"][0]["args"], "token_file", path, "worker-token")
        self.assertFlagInMount(sts["containers"][0]["args"], "admin_token_file", path, "admin-token")
        job = objs[("Job", "summa-worker")]["spec"]["template"]["spec"]
        if rank_tokens:
            self.check_rank_tokens(job)
            return
        secret, path = self.mounted(job, job["containers"][0], TOKENS)
        self.assertEqual(secret["items"], [{"key": "worker-token", "path": "worker-token"}],
                         "a worker never holds the admin token")
        self.assertFlagInMount(job["containers"][0]["args"], "token_file", path, "worker-token")

    def check_rank_tokens(self, job):
        """components/rank-tokens: each worker reads its own rank's key of summa-rank-tokens, the
        completion index declared from the pod's annotation, and no worker mounts summa-tokens (its
        worker-token is the server's list, whose bare token speaks for every rank)."""
        worker = job["containers"][0]
        self.assertEqual([v["name"] for v in job["volumes"] if v.get("secret", {}).get("secretName") == TOKENS], [],
                         "no volume of summa-tokens in a worker pod")
        self.assertNotIn("/etc/summa/tokens", [m["mountPath"] for m in worker["volumeMounts"]])
        secret, path = self.mounted(job, worker, RANK_TOKENS)
        self.assertNotIn("items", secret, "one pod template for every rank: the whole Secret")
        self.assertFlagInMount(worker["args"], "token_file", path, "rank-$(JOB_COMPLETION_INDEX)")
        self.assertEqual([(e["name"], e["valueFrom"]["fieldRef"]["fieldPath"]) for e in worker.get("env", [])],
                         [("JOB_COMPLETION_INDEX", COMPLETION_INDEX)])

    def check_tls(self, objs):
        """components/tls: each side mounts its own kubernetes.io/tls Secret, the flags read its
        keys, the probes moved to the plaintext health port, /metrics to loopback, the socket data
        plane kept (in TLS)."""
        sts = objs[("StatefulSet", "summa-server")]["spec"]["template"]
        server = sts["spec"]["containers"][0]
        _, path = self.mounted(sts["spec"], server, SERVER_TLS)
        for name, key in [("tls_cert", "tls.crt"), ("tls_key", "tls.key"), ("tls_ca", "ca.crt")]:
            self.assertFlagInMount(server["args"], name, path, key)
        health_port = int(flag(server["args"], "health_address").rsplit(":", 1)[1])
        self.assertNotEqual(health_port, int(flag(server["args"], "address").rsplit(":", 1)[1]))
        self.assertEqual(server["readinessProbe"]["grpc"]["port"], health_port)
        self.assertEqual(server["livenessProbe"]["grpc"]["port"], health_port)
        self.assertIn(health_port, [p["containerPort"] for p in server["ports"]])
        self.assertTrue(flag(server["args"], "metrics_address").startswith("127.0.0.1:"))
        # The socket data plane stays, in TLS with the same certificate (its flags above).
        data_port = int(flag(server["args"], "data_address").rsplit(":", 1)[1])
        self.assertIn(data_port, [p["containerPort"] for p in server["ports"] if p["name"] == "data"])
        self.assertEqual(sts["metadata"]["annotations"]["prometheus.io/scrape"], "false",
                         "no scraping a port that listens on loopback")
        job = objs[("Job", "summa-worker")]["spec"]["template"]
        worker = job["spec"]["containers"][0]
        _, path = self.mounted(job["spec"], worker, WORKER_TLS)
        for name, key in [("tls_cert", "tls.crt"), ("tls_key", "tls.key"), ("tls_ca", "ca.crt")]:
            self.assertFlagInMount(worker["args"], name, path, key)
        self.assertTrue(flag(worker["args"], "metrics_address").startswith("127.0.0.1:"))
        self.assertEqual(job["metadata"]["annotations"]["prometheus.io/scrape"], "false")
        return health_port

    def images(self, objs):
        return {objs[k]["spec"]["template"]["spec"]["containers"][0]["image"]
                for k in [("StatefulSet", "summa-server"), ("Job", "summa-worker")]}

    def test_gpu_overlay_gives_each_worker_one_gpu(self):
        objs = render(ARGS.source, "gpu")
        env = self.check_common(objs)
        self.assertEqual(self.images(objs), {"summa:gpu"})
        self.assertEqual(env["SUMMA_DEVICE"], "cuda:0")
        worker = objs[("Job", "summa-worker")]["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(worker["resources"]["limits"]["nvidia.com/gpu"], 1)

    def test_base_overlays_speak_plaintext_with_tokens(self):
        for overlay in ["cpu-demo", "cpu-demo-sharded", "cpu-demo-dedicated-servers", "gpu"]:
            objs = render(ARGS.source, overlay)
            server = objs[("StatefulSet", "summa-server")]["spec"]["template"]["spec"]["containers"][0]
            self.assertEqual(server["readinessProbe"]["grpc"]["port"], 50051)
            self.assertEqual(server["livenessProbe"]["grpc"]["port"], 50051)
            self.assertIsNone(flag(server["args"], "tls_cert"))
            # The socket data plane, on a port of the pod's that the NetworkPolicy admits.
            data_port = int(flag(server["args"], "data_address").rsplit(":", 1)[1])
            self.assertIn(data_port, [p["containerPort"] for p in server["ports"]])
            policy = objs[("NetworkPolicy", "summa-server")]["spec"]["ingress"][0]["ports"]
            self.assertIn(data_port, [p["port"] for p in policy])

    def test_secrets_script_makes_what_the_manifests_mount(self):
        with tempfile.TemporaryDirectory(prefix="summa-k8s-secrets-") as directory:
            secrets = make_secrets(ARGS.source, os.path.join(directory, "material"))
        self.assertEqual(set(secrets[TOKENS]["files"]), {"worker-token", "admin-token"})
        self.assertNotEqual(secrets[TOKENS]["files"]["worker-token"], secrets[TOKENS]["files"]["admin-token"])
        for name in [SERVER_TLS, WORKER_TLS]:
            self.assertEqual(secrets[name]["type"], "kubernetes.io/tls")
            self.assertEqual(set(secrets[name]["files"]), {"tls.crt", "tls.key", "ca.crt"})
        self.assertEqual(secrets[SERVER_TLS]["files"]["ca.crt"], secrets[WORKER_TLS]["files"]["ca.crt"])
        self.assertNotIn(RANK_TOKENS, secrets, "per-rank tokens only when asked for")

    def test_secrets_script_makes_rank_tokens_for_what_the_rank_tokens_overlay_mounts(self):
        """k8s-secrets.sh --rank_tokens=2: summa-rank-tokens holds rank-0 and rank-1, each its
        rank's token alone, the keys the overlay's workers read; summa-tokens' worker-token is the
        server's list (a comment, the bare worker.token, then TOKEN rank=R per rank); DIR holds the
        same files. A count that is not a whole number from 1 is refused before anything is made."""
        objs = render(ARGS.source, "cpu-demo-rank-tokens")
        job = objs[("Job", "summa-worker")]
        worker = job["spec"]["template"]["spec"]["containers"][0]
        config = objs[("ConfigMap", "summa-job")]["data"]
        ranks = job["spec"]["completions"]
        self.assertEqual(ranks, 2)
        with tempfile.TemporaryDirectory(prefix="summa-k8s-secrets-") as directory:
            material = os.path.join(directory, "material")
            secrets = make_rank_secrets(material, ranks)
            written = {}
            for name in ["worker.token", "worker-tokens", "rank-0.token", "rank-1.token"]:
                with open(os.path.join(material, name), "rb") as f:
                    written[name] = f.read()
            self.assertEqual(sorted(n for n in os.listdir(material) if n.startswith("rank-")),
                             ["rank-0.token", "rank-1.token"])
        self.assertEqual(set(secrets), {TOKENS, SERVER_TLS, WORKER_TLS, RANK_TOKENS})
        self.assertNotIn("type", secrets[RANK_TOKENS], "Opaque (kubectl leaves the default out)")
        rank_files = secrets[RANK_TOKENS]["files"]
        # The key each pod's --token_file names, the Job's completion index expanded as the kubelet would.
        keys = [os.path.basename(expand(flag(worker["args"], "token_file"), pod_env(worker, config, i)))
                for i in range(ranks)]
        self.assertEqual(keys, ["rank-0", "rank-1"])
        self.assertEqual(set(rank_files), set(keys))
        rank_tokens = [rank_files[k].decode() for k in keys]
        for r, token in enumerate(rank_tokens):
            self.assertRegex(token, r"^[0-9a-f]{64}\n$", "one token alone: a worker refuses a file of more than one word")
            self.assertEqual(written[f"rank-{r}.token"], rank_files[f"rank-{r}"])
        self.assertEqual(set(secrets[TOKENS]["files"]), {"worker-token", "admin-token"})
        server_list = secrets[TOKENS]["files"]["worker-token"].decode()
        self.assertEqual(written["worker-tokens"].decode(), server_list)
        self.assertTrue(server_list.startswith("# summa-server's --token_file: "), server_list)
        bare = written["worker.token"].decode().strip()
        self.assertEqual(parse_token_list(server_list),
                         [(bare, None)] + [(t.strip(), r) for r, t in enumerate(rank_tokens)])
        every = [bare, *(t.strip() for t in rank_tokens), secrets[TOKENS]["files"]["admin-token"].decode().strip()]
        self.assertEqual(len(set(every)), len(every), "every token its own")
        with tempfile.TemporaryDirectory(prefix="summa-k8s-secrets-") as directory:
            for flags, error in [
                    (["--rank_tokens=0"], "--rank_tokens=0: N must be a whole number, 1 or more (the job's worker count)"),
                    (["--rank_tokens=two"], "--rank_tokens=two: N must be a whole number, 1 or more"),
                    (["--rank_tokens=4097"], "--rank_tokens=4097: at most 4096 ranks (a Secret holds at most 1 MiB)"),
                    (["--rank_tokens"], "--rank_tokens needs its count: --rank_tokens=N"),
                    (["--rank-tokens=2"], "unknown option --rank-tokens=2")]:
                rc, out, err = secrets_script(os.path.join(directory, "material"), *flags)
                self.assertEqual((rc, out), (2, ""), flags)
                self.assertIn(f"k8s-secrets: {error}", err)
            self.assertFalse(os.path.exists(os.path.join(directory, "material")), "refused before anything was made")

    def test_cpu_demo_command_lines_train_on_this_machine(self):
        objs = render(ARGS.source, "cpu-demo")
        self.check_common(objs)
        self.assertEqual(self.images(objs), {"summa:cpu"}, "the image scripts/image.sh builds")
        self.run_overlay(objs)

    def test_cpu_demo_shm_workers_beside_the_server_train_on_the_shared_memory_plane_here(self):
        """components/shared-memory: the workers' pods need a node with a server pod on it, both
        mount the node's /dev/shm where the server's socket (named after its pod) is, and the
        workers, on that node here, take the shared-memory plane."""
        objs = render(ARGS.source, "cpu-demo-shm")
        self.check_common(objs)
        sts = objs[("StatefulSet", "summa-server")]["spec"]["template"]["spec"]
        job = objs[("Job", "summa-worker")]["spec"]["template"]["spec"]
        for spec in (sts, job):
            shm = [v for v in spec["volumes"] if v.get("hostPath", {}).get("path") == "/dev/shm"]
            self.assertEqual(len(shm), 1, spec["volumes"])
            mounts = [m["mountPath"] for m in spec["containers"][0]["volumeMounts"] if m["name"] == shm[0]["name"]]
            self.assertEqual(mounts, ["/run/summa"])
        self.assertEqual(flag(sts["containers"][0]["args"], "shm_socket"), "/run/summa/summa-$(POD_NAME).sock")
        self.assertIn({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                      sts["containers"][0]["env"])
        terms = job["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        self.assertEqual(terms, [{"labelSelector": {"matchLabels": {"app": "summa-server"}},
                                  "topologyKey": "kubernetes.io/hostname"}])
        self.run_overlay(objs, plane="shared-memory plane")

    def test_cpu_demo_sharded_command_lines_train_on_two_shards_on_this_machine(self):
        objs = render(ARGS.source, "cpu-demo-sharded")
        self.check_common(objs)
        self.assertEqual(objs[("StatefulSet", "summa-server")]["spec"]["replicas"], 2)
        self.run_overlay(objs)

    def test_cpu_demo_dedicated_servers_place_each_shard_on_a_node_of_its_own_and_train_here(self):
        """components/dedicated-servers: placed by the rules a scheduler applies (nodeSelector,
        taints, required pod anti-affinity both ways, on the hostname), k = 4 shards take the 4
        nodes labelled and tainted summa.io/role=server, one each, and no worker lands on one; with
        one such node fewer, a shard stays pending rather than share a node. Then the overlay's
        command lines train on this machine (4 shard processes)."""
        objs = render(ARGS.source, "cpu-demo-dedicated-servers")
        env = self.check_common(objs)
        sts = objs[("StatefulSet", "summa-server")]
        self.assertEqual(sts["spec"]["replicas"], 4)
        self.assertEqual(int(env["SUMMA_SHARDS"]), 4)
        job = objs[("Job", "summa-worker")]
        server_pod = sts["spec"]["template"]
        worker_pod = job["spec"]["template"]
        taint = {"key": "summa.io/role", "value": "server", "effect": "NoSchedule"}
        servers = [(f"summa-server-{i}", server_pod) for i in range(sts["spec"]["replicas"])]
        workers = [(f"summa-worker-{i}", worker_pod) for i in range(job["spec"]["completions"])]

        def nodes(server_nodes, other_nodes):
            return ([{"name": f"server-node-{i}", "labels": {"summa.io/role": "server"}, "taints": [taint]}
                     for i in range(server_nodes)] +
                    [{"name": f"node-{i}", "labels": {}, "taints": []} for i in range(other_nodes)])

        placed = schedule(servers + workers, nodes(4, 2))
        self.assertEqual(sorted(placed[name] for name, _ in servers), [f"server-node-{i}" for i in range(4)],
                         "one shard on each server node")
        for name, _ in workers:
            self.assertTrue(placed[name].startswith("node-"), f"{name} on {placed[name]}")
        self.assertNotEqual(placed["summa-worker-0"], placed["summa-worker-1"], "workers spread when they can")
        short = schedule(servers + workers, nodes(3, 2))
        self.assertEqual([name for name, _ in servers if short[name] is None], ["summa-server-3"],
                         "a fourth shard waits for a fourth server node")
        self.assertTrue(all(short[name] and short[name].startswith("node-") for name, _ in workers))
        self.run_overlay(objs)

    def test_cpu_demo_tls_command_lines_train_and_probe_on_this_machine(self):
        objs = render(ARGS.source, "cpu-demo-tls")
        self.check_common(objs, tls=True)
        self.run_overlay(objs, health_port=self.check_tls(objs))

    def test_cpu_demo_rank_tokens_train_and_a_worker_with_another_ranks_key_is_refused(self):
        """components/rank-tokens: the server reads the list, each worker its own rank's key; the
        job trains. A pod whose token file is rank 1's key but whose completion index (its rank) is
        0, started while both workers are held before step 5's push, is refused with
        PERMISSION_DENIED naming both ranks, and rank 0's worker keeps its session: each worker
        joined once and the job ends on its last step. The workers' only extra argument is the test
        build's --fault_pause, which holds them until the refusal has been seen."""
        objs = render(ARGS.source, "cpu-demo-rank-tokens")
        self.check_common(objs, rank_tokens=True)
        self.assertEqual(self.images(objs), {"summa:cpu"})
        self.run_overlay(objs, rank_tokens=True)

    def test_cpu_demo_elastic_workers_scale_up_and_down_while_the_job_runs(self):
        """The elastic overlay: the workers are a StatefulSet (pod I is rank I, from the pod-index
        label) and the server runs --workers=2:4 under shrink. Run here as the kubelet would, the
        job starts with 2 pods; a third (kubectl scale --replicas=3) joins at a step boundary;
        it is stopped as a scale-down stops it (SIGTERM) and the job goes on with 2; each
        worker, done, waits for its SIGTERM and exits 0. The pods' only extra arguments are the
        test build's --fault_pause, so that the scaling lands on steps the test chooses."""
        objs = render(ARGS.source, "cpu-demo-elastic")
        self.assertNotIn(("Job", "summa-worker"), objs, "the indexed Job gives way to the StatefulSet")
        sts = objs[("StatefulSet", "summa-worker")]
        self.assertEqual(sts["spec"]["podManagementPolicy"], "Parallel")
        self.assertEqual(objs[("Service", "summa-worker")]["spec"]["clusterIP"], "None")
        pod = sts["spec"]["template"]["spec"]
        worker = pod["containers"][0]
        self.assertEqual(flag(worker["args"], "rank"), "$(POD_INDEX)")
        self.assertEqual(flag(worker["args"], "after_training"), "wait")
        index_env = {e["name"]: e for e in worker["env"]}["POD_INDEX"]
        self.assertEqual(index_env["valueFrom"]["fieldRef"]["fieldPath"], "metadata.labels['apps.kubernetes.io/pod-index']")
        env = objs[("ConfigMap", "summa-job")]["data"]
        self.assertEqual(env["SUMMA_WORKERS"], "2:4")
        self.assertEqual(sts["spec"]["replicas"], int(env["SUMMA_MIN_WORKERS"]))
        self.assertEqual(env["SUMMA_ON_WORKER_LOSS"], "shrink")
        server_pod = objs[("StatefulSet", "summa-server")]["spec"]["template"]["spec"]
        server_container = server_pod["containers"][0]
        steps = int(env["SUMMA_EPOCHS"]) * (int(env["SUMMA_TRAIN_LIMIT"]) // int(env["SUMMA_BATCH_SIZE"]))
        with ProcessGroup() as g:
            secrets = make_secrets(ARGS.source, os.path.join(g.dir, "secrets"))
            mounts = pod_volumes(server_pod, server_container, secrets, os.path.join(g.dir, "server-pod"))
            port_file = os.path.join(g.dir, "server.port")
            args = [to_host(expand(x, env), mounts, {"address", "metrics_address", "health_address", "data_address"})
                    for x in server_container["args"]]
            server = g.start("server", [os.path.join(ARGS.bin, "server/summa-server"), *args, f"--port_file={port_file}"],
                             env={**env, "HOSTNAME": "summa-server-0"})
            port = int(g.wait_for_file(port_file, server))
            pods = {}

            def start_pod(index, *test_args):
                mounts = pod_volumes(pod, worker, secrets, os.path.join(g.dir, f"worker{index}-pod"))
                pod_env = {**env, "POD_INDEX": str(index)}  # the downward API's label value
                args = [to_host(expand(x, pod_env).replace(SERVICE + ":50051", f"127.0.0.1:{port}"), mounts,
                                {"status_address", "metrics_address"}) for x in worker["args"]]
                pods[index] = g.start(f"summa-worker-{index}", [os.path.join(ARGS.bin, "worker/summa-worker"), *args,
                                                                *test_args], env=pod_env)

            def wait_for_log(index, text):
                g.wait_for_log(pods[index], text, 120)

            def status():  # GetStatus needs no token (no --status_needs_token)
                return Reflector(f"127.0.0.1:{port}", timeout=5).call("summa.v1.ParameterServer/GetStatus")

            go, go_on = os.path.join(g.dir, "go"), os.path.join(g.dir, "go-on")
            for index in range(sts["spec"]["replicas"]):
                start_pod(index, f"--fault_pause=20:{go}")
            for index in pods:
                wait_for_log(index, "pausing before the push of step 20")
            start_pod(2, f"--fault_pause=40:{go_on}")  # kubectl scale --replicas=3
            wait_until("the third pod's join", lambda: len(status().get("members", [])) == 3, 120)
            open(go, "w").close()
            wait_for_log(2, "pausing before the push of step 40")
            pods[2].send_signal(signal.SIGTERM)  # kubectl scale --replicas=2: pod 2 is stopped
            self.assertEqual(g.wait(pods[2], 30), 128 + signal.SIGTERM, g.log(pods[2]))
            for index in (0, 1):
                wait_for_log(index, "training done; waiting for SIGTERM")
                pods[index].send_signal(signal.SIGTERM)
                self.assertEqual(g.wait(pods[index], 30), 0, g.log(pods[index]))
            self.assertIn("rank 2 of 2 joined at step 21", g.log(pods[2]))
            final = status()
            self.assertEqual(int(final["version"]), steps)
            changes = [(int(c.get("fromStep", 0)), [int(r) for r in c["ranks"]]) for c in final["groupChanges"]]
            self.assertEqual(changes, [(0, [0, 1]), (21, [0, 1, 2]), (40, [0, 1])])
            self.assertEqual(int(final["examplesApplied"]), steps * int(env["SUMMA_BATCH_SIZE"]))
            accs = [float(a) for a in re.findall(r"test acc ([0-9.]+)", g.log(pods[0]))]
            self.assertGreater(accs[-1], 0.3, "well above chance (0.1)")

    def run_overlay(self, objs, health_port=None, rank_tokens=False, plane="socket data plane"):
        """Runs the overlay's server and workers on this host and sees the job train; with TLS,
        also probes as the kubelet would (plaintext, on the health port) and checks that the
        server's certificate names the address the workers dial; with rank_tokens, holds the
        workers before step 5 while a pod with rank 1's key as rank 0 is refused."""
        env = objs[("ConfigMap", "summa-job")]["data"]
        sts = objs[("StatefulSet", "summa-server")]["spec"]["template"]["spec"]
        server_container = sts["containers"][0]
        job = objs[("Job", "summa-worker")]
        worker_pod = job["spec"]["template"]["spec"]
        worker = worker_pod["containers"][0]
        binaries = {"/usr/local/bin/summa-server": os.path.join(ARGS.bin, "server/summa-server"),
                    "/usr/local/bin/summa-worker": os.path.join(ARGS.bin, "worker/summa-worker")}
        replicas = objs[("StatefulSet", "summa-server")]["spec"].get("replicas", 1)
        self.assertEqual(replicas, int(env["SUMMA_SHARDS"]), "one server pod per shard")
        pods = [f"summa-server-{i}.summa-server:50051" for i in range(replicas)]
        self.assertEqual(env["SUMMA_SERVER"], ",".join(pods),
                         "workers reach every shard by its pod's DNS name, in shard order")
        with ProcessGroup() as g:
            node = os.path.join(g.dir, "node")  # every pod runs on this one node (its hostPaths)
            if rank_tokens:
                secrets = make_rank_secrets(os.path.join(g.dir, "secrets"), job["spec"]["completions"])
            else:
                secrets = make_secrets(ARGS.source, os.path.join(g.dir, "secrets"))
            ports, servers = [], []

            def to_local(arg):  # a pod's DNS name to the port its process listens on here
                for pod, port in zip(pods, ports):
                    arg = arg.replace(pod, f"127.0.0.1:{port}")
                return arg

            for i in range(replicas):
                # Pod summa-server-i: its own volumes, and the hostname its shard comes from.
                mounts = pod_volumes(sts, server_container, secrets, os.path.join(g.dir, f"server{i}-pod"), node)
                port_file = os.path.join(g.dir, f"server{i}.port")
                health_port_file = os.path.join(g.dir, f"health{i}.port")
                # The pod's own env (the downward API's metadata.name), then the ConfigMap's.
                pod_fields = {"POD_NAME": f"summa-server-{i}"}
                server_args = [to_host(to_local(expand(x, {**env, **pod_fields})), mounts,
                                       {"address", "metrics_address", "health_address", "data_address"})
                               for x in server_container["args"]]
                server_args.append(f"--port_file={port_file}")
                if health_port is not None:
                    server_args.append(f"--health_port_file={health_port_file}")
                server = g.start(f"server{i}", [binaries[server_container["command"][0]], *server_args],
                                 env={**env, "HOSTNAME": f"summa-server-{i}"})
                servers.append(server)
                ports.append(int(g.wait_for_file(port_file, server)))
                if health_port is not None:
                    self.probe_tls_server(server_container, ports[i], int(g.wait_for_file(health_port_file, server)),
                                          secrets)
                if replicas > 1:
                    self.assertIn(f"shard {i} of {replicas}", g.log(server))
                if i > 0:
                    self.assertIn(f"follows shard 0's membership view at 127.0.0.1:{ports[0]}", g.log(server))

            def start_worker(name, index, args_index=None, *test_args):
                """Pod `index` of the Job; its args expanded as pod `args_index`'s would be (the
                same pod unless a test mismatches them)."""
                args_env = pod_env(worker, env, index if args_index is None else args_index)
                mounts = pod_volumes(worker_pod, worker, secrets, os.path.join(g.dir, f"{name}-pod"), node)
                args = [to_host(to_local(expand(x, args_env)), mounts, {"status_address", "metrics_address"})
                        for x in worker["args"]]
                # The Job controller's JOB_COMPLETION_INDEX, which summa-worker takes as its rank.
                return g.start(name, [binaries[worker["command"][0]], *args, *test_args],
                               env={**pod_env(worker, env, index), "JOB_COMPLETION_INDEX": str(index)})

            go = os.path.join(g.dir, "go")
            hold = [f"--fault_pause=5:{go}"] if rank_tokens else []
            workers = [start_worker(f"worker{index}", index, None, *hold)
                       for index in range(job["spec"]["completions"])]
            if rank_tokens:
                for w in workers:
                    g.wait_for_log(w, "pausing before the push of step 5", 120)
                intruder = start_worker("intruder", 0, 1)  # rank 1's key, completion index 0
                self.assertEqual(g.wait(intruder, 120), 1, g.log(intruder))
                self.assertIn("PERMISSION_DENIED", g.log(intruder))
                self.assertIn("this token is rank 1's (--token_file); it cannot act as rank 0", g.log(intruder))
                for w in workers:
                    self.assertIsNone(w.poll(), f"{w.name} stopped while the intruder was refused:\n{g.log(w)}")
                open(go, "w").close()
            for w in workers:
                self.assertEqual(g.wait(w, 300), 0, g.log(w))
            if rank_tokens:
                status = Reflector(f"127.0.0.1:{ports[0]}", timeout=5).call("summa.v1.ParameterServer/GetStatus")
                steps = int(env["SUMMA_EPOCHS"]) * (int(env["SUMMA_TRAIN_LIMIT"]) // int(env["SUMMA_BATCH_SIZE"]))
                self.assertEqual(int(status["version"]), steps, status)
                self.assertEqual([(int(m.get("rank", 0)), m["joins"]) for m in status["members"]], [(0, 1), (1, 1)],
                                 "each worker joined once: the intruder fenced no one")
            out = g.log(workers[0])
            print(out)
            self.assertIn(f"rank 0 of {env['SUMMA_WORKERS']} joined", out)
            self.assertIn("rank 1 of", g.log(workers[1]))
            accs = [float(a) for a in re.findall(r"test acc ([0-9.]+)", out)]
            self.assertEqual(len(accs), int(env["SUMMA_EPOCHS"]))
            self.assertGreater(accs[-1], 0.3, "well above chance (0.1)")
            # The workers found the socket data plane (with their token) and used it: in TLS
            # under components/tls (the server says which suite); the shared-memory plane under
            # components/shared-memory.
            for w in workers:
                self.assertIn(f"the data path goes over the {plane}", g.log(w))
            for server in servers:
                self.assertEqual("data plane: TLSv1.3" in g.log(server), health_port is not None)

    def probe_tls_server(self, container, port, health_port, secrets):
        import grpc
        readiness = container["readinessProbe"]["grpc"]
        # The kubelet's probes: plaintext, on the health port.
        self.assertEqual(health_check(f"127.0.0.1:{health_port}"), 1, "liveness: SERVING")
        self.assertEqual(health_check(f"127.0.0.1:{health_port}", readiness["service"]), 1, "readiness: SERVING")
        # The main port speaks only TLS ...
        self.assertEqual(health_check(f"127.0.0.1:{port}"), "UNAVAILABLE")
        # ... with a certificate that names the address the workers dial, for a client that
        # shows the workers' certificate (mutual TLS).
        files = secrets[WORKER_TLS]["files"]
        credentials = grpc.ssl_channel_credentials(files["ca.crt"], files["tls.key"], files["tls.crt"])
        self.assertEqual(health_check(f"127.0.0.1:{port}", credentials=credentials, target_name=SERVICE), 1)
        anonymous = grpc.ssl_channel_credentials(files["ca.crt"])
        self.assertEqual(health_check(f"127.0.0.1:{port}", credentials=anonymous, target_name=SERVICE),
                         "UNAVAILABLE", "no client certificate, no call")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--source", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
