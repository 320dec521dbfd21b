"""Kubernetes manifests: every overlay renders with `kubectl kustomize` and holds what Summa
promises (headless Service, StatefulSet with a checkpoint volume and gRPC probes, indexed worker
Job, ConfigMap, NetworkPolicy, PodDisruptionBudget, one GPU per worker in the gpu overlay), and
the cpu-demo overlay's exact command lines and environment train on this machine: the binaries
run as the containers would, with the Service's DNS name and the listen addresses mapped to
127.0.0.1 (OS-chosen ports) and the completion index as the rank. Drift between the manifests
and the binaries' flags fails here."""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import unittest

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from procs import ProcessGroup  # noqa: E402

ARGS = None


def render(overlay):
    out = subprocess.run(["kubectl", "kustomize", os.path.join(ARGS.source, "deploy/k8s/overlays", overlay)],
                         capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def expand(arg, env):
    """Kubernetes' $(VAR) expansion of container args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)


class K8sManifestTest(unittest.TestCase):
    def check_common(self, objs):
        svc = objs[("Service", "summa-server")]
        self.assertEqual(svc["spec"]["clusterIP"], "None")
        sts = objs[("StatefulSet", "summa-server")]
        self.assertEqual(sts["spec"]["serviceName"], "summa-server")
        self.assertTrue(sts["spec"]["volumeClaimTemplates"])
        server = sts["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(server["readinessProbe"]["grpc"]["port"], 50051)
        self.assertEqual(server["livenessProbe"]["grpc"]["port"], 50051)
        self.assertIn("limits", server["resources"])
        self.assertEqual(sts["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"], "true")
        job = objs[("Job", "summa-worker")]
        self.assertEqual(job["spec"]["completionMode"], "Indexed")
        env = objs[("ConfigMap", "summa-job")]["data"]
        self.assertEqual(job["spec"]["completions"], int(env["SUMMA_WORKERS"]))
        self.assertEqual(job["spec"]["template"]["spec"]["restartPolicy"], "OnFailure")
        self.assertIn(("NetworkPolicy", "summa-server"), objs)
        self.assertIn(("PodDisruptionBudget", "summa-server"), objs)
        return env

    def test_gpu_overlay_gives_each_worker_one_gpu(self):
        objs = render("gpu")
        env = self.check_common(objs)
        self.assertEqual(env["SUMMA_DEVICE"], "cuda:0")
        worker = objs[("Job", "summa-worker")]["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(worker["resources"]["limits"]["nvidia.com/gpu"], 1)

    def test_cpu_demo_command_lines_train_on_this_machine(self):
        objs = render("cpu-demo")
        env = self.check_common(objs)
        sts = objs[("StatefulSet", "summa-server")]["spec"]["template"]["spec"]["containers"][0]
        job = objs[("Job", "summa-worker")]
        worker = job["spec"]["template"]["spec"]["containers"][0]
        binaries = {"/usr/local/bin/summa-server": os.path.join(ARGS.bin, "server/summa-server"),
                    "/usr/local/bin/summa-worker": os.path.join(ARGS.bin, "worker/summa-worker")}
        with ProcessGroup() as g:
            port_file = os.path.join(g.dir, "server.port")
            ckpt = tempfile.mkdtemp(prefix="summa-k8s-ckpt-")
            server_args = []
            for a in (expand(x, env) for x in sts["args"]):
                # Only the addresses and the volume path change: the Pod's view mapped onto this host.
                a = {"--address=0.0.0.0:50051": "--address=127.0.0.1:0",
                     "--metrics_address=0.0.0.0:9464": "--metrics_address=127.0.0.1:0",
                     "--checkpoint_dir=/var/lib/summa": f"--checkpoint_dir={ckpt}"}.get(a, a)
                server_args.append(a)
            server = g.start("server", [binaries[sts["command"][0]], *server_args,
                                        f"--port_file={port_file}"], env=env)
            port = int(g.wait_for_file(port_file, server))
            service = "summa-server-0.summa-server:50051"
            self.assertEqual(env["SUMMA_SERVER"], service, "workers reach the server by its Service name")
            workers = []
            for index in range(job["spec"]["completions"]):
                args = []
                for a in (expand(x, env) for x in worker["args"]):
                    a = a.replace(service, f"127.0.0.1:{port}")
                    a = {"--status_address=0.0.0.0:50052": "--status_address=127.0.0.1:0",
                         "--metrics_address=0.0.0.0:9465": "--metrics_address=127.0.0.1:0"}.get(a, a)
                    args.append(a)
                workers.append(g.start(f"worker{index}", [binaries[worker["command"][0]], *args],
                                       env={**env, "JOB_COMPLETION_INDEX": str(index)}))
            for w in workers:
                self.assertEqual(g.wait(w, 300), 0, g.log(w))
            out = g.log(workers[0])
            print(out)
            self.assertIn(f"rank 0 of {env['SUMMA_WORKERS']} joined", out)
            self.assertIn("rank 1 of", g.log(workers[1]))
            accs = [float(a) for a in re.findall(r"test acc ([0-9.]+)", out)]
            self.assertEqual(len(accs), int(env["SUMMA_EPOCHS"]))
            self.assertGreater(accs[-1], 0.3, "well above chance (0.1)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--source", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
