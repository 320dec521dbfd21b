"""The container image (deploy/docker/Dockerfile, built by scripts/image.sh) run as the cpu-demo
overlay runs it: the server and the two workers are containers of the image the overlay names
(summa:cpu), with the overlay's command, arguments and environment, and each container's
securityContext as podman flags: its user (the pod's runAsUser, fsGroup added), a read-only
root filesystem (no tmpfs added), every capability dropped, no privilege escalation. The
Secret volumes are directories written as the kubelet would (tests/tools/k8s_pods.py); the
server's checkpoint claim is a named volume. The containers share the host's network: the
listen addresses are mapped to 127.0.0.1 with OS-chosen ports (the server's is read from its
log), and the workers dial the Service's DNS name, which --add-host points at 127.0.0.1.

Needs a container engine (scripts/container.sh); without one every case exits 77 (skipped) and
says why. ctest builds the image first (container_image_build, tests/CMakeLists.txt)."""
import argparse
import json
import os
import re
import subprocess
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from grpc_reflect import Reflector  # noqa: E402
from k8s_pods import expand, make_secrets, pod_volumes, render, to_host  # noqa: E402
from procs import ProcessGroup  # noqa: E402

ARGS = None
SERVICE = "summa-server-0.summa-server"


def engine(*args, check=True, timeout=120):
    """scripts/container.sh ARGS: its stdout (stripped)."""
    done = subprocess.run([os.path.join(ARGS.source, "scripts/container.sh"), *args],
                          capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"container.sh {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    return done.stdout.strip()


class Pod:
    """The containers and volumes one test starts, removed on every path when it exits."""

    def __init__(self, group):
        self.g = group
        self.prefix = f"summa-test-{uuid.uuid4().hex[:8]}"
        self.containers, self.volumes = [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for name in self.containers:
            engine("rm", "-f", "--time=5", name, check=False)
        for name in self.volumes:
            engine("volume", "rm", "-f", name, check=False)
        return False

    def volume(self, name):
        full = f"{self.prefix}-{name}"
        engine("volume", "create", full)
        self.volumes.append(full)
        return full

    def run(self, name, image, pod_spec, container, args, env, mounts, restart=None):
        """Starts `container` of the pod as the kubelet would (see the module's docstring) and
        returns its name; `mounts` maps each mount path to a host directory or a named volume."""
        pod_sc, sc = pod_spec.get("securityContext", {}), container.get("securityContext", {})
        flags = ["--detach", f"--name={self.prefix}-{name}", f"--add-host={SERVICE}:127.0.0.1",
                 f"--entrypoint={container['command'][0]}"]
        if "runAsUser" in pod_sc:
            flags.append(f"--user={pod_sc['runAsUser']}")
        if "fsGroup" in pod_sc:
            flags.append(f"--group-add={pod_sc['fsGroup']}")
        if sc.get("readOnlyRootFilesystem"):
            flags += ["--read-only", "--read-only-tmpfs=false"]
        if "ALL" in sc.get("capabilities", {}).get("drop", []):
            flags.append("--cap-drop=all")
        if sc.get("allowPrivilegeEscalation") is False:
            flags.append("--security-opt=no-new-privileges")
        if restart:
            flags.append(f"--restart={restart}")
        read_only = {m["mountPath"] for m in container.get("volumeMounts", []) if m.get("readOnly")}
        for path, source in mounts.items():
            flags.append(f"--volume={source}:{path}" + (":ro" if path in read_only else ""))
        for k, v in env.items():
            flags.append(f"--env={k}={v}")
        self.containers.append(f"{self.prefix}-{name}")
        engine("run", *flags, image, *container["command"][1:], *args)
        return f"{self.prefix}-{name}"

    def inspect(self, name, fmt):
        return engine("inspect", f"--format={fmt}", name)

    def logs(self, name):
        done = subprocess.run([os.path.join(ARGS.source, "scripts/container.sh"), "logs", name],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        return done.stdout

    def wait(self, name, seconds):
        """The container's exit status once it has stopped (and will not be restarted)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.inspect(name, "{{.State.Status}}") in ("exited", "stopped"):
                return int(self.inspect(name, "{{.State.ExitCode}}"))
            time.sleep(0.2)
        raise AssertionError(f"{name} still running after {seconds} s:\n{self.logs(name)}")

    def wait_for_log(self, name, pattern, seconds=60, restarting=False):
        """The first match of `pattern` in the container's log; gives up when it stops, unless
        it is `restarting` (between a kill and the engine's restart it shows as exited)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            m = re.search(pattern, self.logs(name))
            if m:
                return m
            if not restarting and self.inspect(name, "{{.State.Status}}") in ("exited", "stopped"):
                break
            time.sleep(0.1)
        raise AssertionError(f"{name} never logged /{pattern}/:\n{self.logs(name)}")


def members(status):
    return {m.get("rank", 0): m for m in status["members"]}


class ContainerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(ARGS.image_id_file) as f:
            cls.image = f.read().strip()
        cls.objs = render(ARGS.source, "cpu-demo")
        cls.env = cls.objs[("ConfigMap", "summa-job")]["data"]

    def test_the_image_is_the_overlays_labelled_non_root_and_holds_no_toolchain(self):
        sts = self.objs[("StatefulSet", "summa-server")]["spec"]["template"]["spec"]
        named = sts["containers"][0]["image"]
        self.assertEqual(named, "summa:cpu")
        info = json.loads(engine("image", "inspect", self.image))[0]
        self.assertEqual(engine("image", "inspect", "--format={{.Id}}", f"localhost/{named}"), info["Id"],
                         f"{named}, which the cpu-demo overlay runs, is the image just built")
        self.assertEqual(info["Config"]["User"], "65532:65532", "the image runs as a non-root user")
        labels = info["Config"]["Labels"]
        revision = subprocess.run(["git", "-C", ARGS.source, "rev-parse", "HEAD"],
                                  capture_output=True, text=True).stdout.strip()
        if revision:
            self.assertEqual(labels["org.opencontainers.image.revision"], revision)
            short = revision[:12]
            self.assertTrue(any(t.startswith(f"localhost/summa:cpu-{short}") for t in info["RepoTags"]),
                            info["RepoTags"])
        for key in ["source", "version", "title"]:
            self.assertNotIn(labels.get(f"org.opencontainers.image.{key}", "unknown"), ("", "unknown"), key)
        # The runtime stage holds the binaries, their libraries and the data, not the build's tools.
        out = subprocess.run(
            [os.path.join(ARGS.source, "scripts/container.sh"), "run", "--rm", "--entrypoint=/bin/sh", self.image,
             "-c", "id -u; ls /usr/share/datasets/fashion-mnist; command -v c++ cmake protoc || echo no-toolchain;"
                   " dpkg-query -W -f='${Package}\\n' | grep -e '-dev$' || echo no-dev-packages"],
            capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), [
            "65532", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz",
            "train-labels-idx1-ubyte.gz", "no-toolchain", "no-dev-packages"])
        # A production build: summa-worker has no fault injection (tests/CMakeLists.txt builds the
        # image's binaries with -DSUMMA_FAULT_INJECTION=OFF, deploy/docker/stage.sh refuses others),
        # so it lists no --fault_* flag and refuses one as unknown.
        def worker(*args):
            return subprocess.run(
                [os.path.join(ARGS.source, "scripts/container.sh"), "run", "--rm",
                 "--entrypoint=/usr/local/bin/summa-worker", self.image, *args],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        listed = worker("--help").stdout
        self.assertIn("--server", listed, "summa-worker --help lists its flags")
        self.assertNotIn("--fault_", listed, "the image's summa-worker has the test-only --fault_* flags")
        refused = worker("--fault_exit_after_push=0")
        self.assertNotEqual(refused.returncode, 0, refused.stdout)
        self.assertIn("Unknown command line flag 'fault_exit_after_push'", refused.stdout)

    def test_cpu_demo_in_containers_trains_serves_status_and_a_killed_worker_rejoins(self):
        objs, env = self.objs, self.env
        sts = objs[("StatefulSet", "summa-server")]["spec"]
        server_pod = sts["template"]["spec"]
        server_c = server_pod["containers"][0]
        job = objs[("Job", "summa-worker")]["spec"]
        worker_pod = job["template"]["spec"]
        worker_c = worker_pod["containers"][0]
        self.assertEqual(env["SUMMA_ON_WORKER_LOSS"], "wait")
        self.assertEqual(job["template"]["spec"]["restartPolicy"], "OnFailure")
        world = int(env["SUMMA_WORKERS"])
        steps_per_epoch = int(env["SUMMA_TRAIN_LIMIT"]) // int(env["SUMMA_BATCH_SIZE"])
        steps = int(env["SUMMA_EPOCHS"]) * steps_per_epoch
        every = int(env["SUMMA_CHECKPOINT_EVERY"])
        with ProcessGroup() as g, Pod(g) as pod:
            secrets = make_secrets(ARGS.source, os.path.join(g.dir, "secrets"))
            claims = {c["metadata"]["name"] for c in sts["volumeClaimTemplates"]}

            def mounts_of(pod_spec, container, name):
                """Each mount: a Secret's directory (group fsGroup, as the kubelet writes it) or
                a named volume for a claim."""
                dirs = pod_volumes(pod_spec, container, secrets, os.path.join(g.dir, name))
                group = pod_spec.get("securityContext", {}).get("fsGroup")
                out = {}
                for m in container["volumeMounts"]:
                    if m["name"] in claims:
                        out[m["mountPath"]] = volumes.setdefault(m["name"], pod.volume(m["name"]))
                        continue
                    for root, _, files in os.walk(dirs[m["mountPath"]]):
                        for f in [root, *[os.path.join(root, f) for f in files]]:
                            os.chown(f, 0, group if group is not None else 0)
                    out[m["mountPath"]] = dirs[m["mountPath"]]
                return out

            volumes = {}
            server_mounts = mounts_of(server_pod, server_c, "server-pod")
            server_args = [to_host(expand(a, env), {}, {"address", "metrics_address"}) for a in server_c["args"]]
            server = pod.run("server", self.image, server_pod, server_c, server_args, env, server_mounts)
            port = int(pod.wait_for_log(server, r"listening on port (\d+)").group(1))

            # The server process is the non-root user, and the root filesystem is read-only to it.
            pid = pod.inspect(server, "{{.State.Pid}}")
            with open(f"/proc/{pid}/status") as f:
                uid = re.search(r"^Uid:\s+(\d+)", f.read(), re.M).group(1)
            self.assertEqual(int(uid), server_pod["securityContext"]["runAsUser"])
            self.assertNotEqual(int(uid), 0)
            touched = subprocess.run([os.path.join(ARGS.source, "scripts/container.sh"), "exec", server,
                                      "touch", "/opt/summa/x"], capture_output=True, text=True)
            self.assertIn("Read-only file system", touched.stderr)

            # grpcurl's list, health check and GetStatus, through reflection.
            r = Reflector(f"127.0.0.1:{port}", timeout=10)
            self.assertIn("grpc.health.v1.Health", r.list_services())
            self.assertIn("summa.v1.ParameterServer", r.list_services())
            readiness = server_c["readinessProbe"]["grpc"]["service"]
            self.assertEqual(r.call("grpc.health.v1.Health/Check", json.dumps({"service": readiness})),
                             {"status": "SERVING"})
            status = r.call("summa.v1.ParameterServer/GetStatus")
            self.assertEqual((status["worldSize"], status["mode"]), (world, "MODE_SYNC"))

            workers = []
            for index in range(job["completions"]):
                mounts = mounts_of(worker_pod, worker_c, f"worker{index}-pod")
                args = [to_host(expand(a, env).replace(env["SUMMA_SERVER"], f"{SERVICE}:{port}"), {},
                                {"status_address", "metrics_address"}) for a in worker_c["args"]]
                workers.append(pod.run(f"worker{index}", self.image, worker_pod, worker_c, args,
                                       {**env, "JOB_COMPLETION_INDEX": str(index)}, mounts,
                                       restart="on-failure"))

            # Kill worker 1's process mid-job (SIGKILL, from the host) once the job is past step
            # 60 of 250; the engine restarts its container (restartPolicy OnFailure) and the new
            # process rejoins as rank 1, its completion index. The image's worker has no fault
            # injection to slow the job down (--fault_delay_push), and at full speed the 190 steps
            # after step 60 take about 1 s: its PID is read beforehand (podman's inspect takes a
            # good part of that), the version polled every 10 ms, and the kill sent at once.
            killed = pod.inspect(workers[1], "{{.State.Pid}}")
            deadline = time.monotonic() + 180
            while int(r.call("summa.v1.ParameterServer/GetStatus").get("version", 0)) < 60:
                self.assertLess(time.monotonic(), deadline, "version 60 not reached:\n" + pod.logs(workers[1]))
                time.sleep(0.01)
            os.kill(int(killed), 9)
            at_kill = int(r.call("summa.v1.ParameterServer/GetStatus").get("version", 0))
            self.assertLess(at_kill, steps, "the job ended before the kill landed: it no longer tests a rejoin")
            pod.wait_for_log(workers[1], r"(?s)joined at step 0 .*joined at step [1-9]\d* ", seconds=120,
                              restarting=True)
            self.assertNotEqual(pod.inspect(workers[1], "{{.State.Pid}}"), killed)

            for w in workers:
                self.assertEqual(pod.wait(w, 300), 0, pod.logs(w))
            out = pod.logs(workers[0])
            print(out)
            epochs = re.findall(r"^epoch (\d+)/(\d+): loss [0-9.]+, test acc ([0-9.]+), .* (\d+) workers on "
                                r"\[cpu, cpu\]$", out, re.M)
            self.assertEqual([(int(e), int(n)) for e, n, _, _ in epochs],
                             [(e, int(env["SUMMA_EPOCHS"])) for e in range(1, int(env["SUMMA_EPOCHS"]) + 1)])
            self.assertGreater(float(epochs[-1][2]), 0.3, "well above chance (0.1)")
            self.assertEqual(pod.inspect(workers[1], "{{.RestartCount}}"), "1")

            # Under wait no step completed without the killed worker: both pushed every step once.
            status = r.call("summa.v1.ParameterServer/GetStatus")
            self.assertEqual(int(status["version"]), steps)
            by_rank = members(status)
            self.assertEqual(by_rank[1]["joins"], 2, by_rank)
            self.assertEqual([int(by_rank[k]["pushes"]) for k in range(world)], [steps] * world, by_rank)
            self.assertEqual(sum(int(m["examples"]) for m in by_rank.values()),
                             steps * int(env["SUMMA_BATCH_SIZE"]), by_rank)
            # The server's ticker checkpoints once `every` steps have passed since the last one.
            deadline = time.monotonic() + 60
            while int(status.get("lastCheckpointVersion", 0)) < every:
                self.assertLess(time.monotonic(), deadline, f"no checkpoint past version {every}")
                time.sleep(0.1)
                status = r.call("summa.v1.ParameterServer/GetStatus")

            # The checkpoints live on the volume: SIGTERM writes a last one, and a new server
            # container on the same volume restores it.
            engine("stop", "--time=30", server)
            self.assertEqual(pod.wait(server, 60), 0, pod.logs(server))
            again = pod.run("server-again", self.image, server_pod, server_c, server_args, env, server_mounts)
            pod.wait_for_log(again, rf"restored /var/lib/summa/\S+ at version {steps}\b")
            port = int(pod.wait_for_log(again, r"listening on port (\d+)").group(1))
            status = Reflector(f"127.0.0.1:{port}", timeout=10).call("summa.v1.ParameterServer/GetStatus")
            self.assertEqual(int(status["version"]), steps)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--image_id_file", required=True)
    ARGS, rest = ap.parse_known_args()
    which = subprocess.run([os.path.join(ARGS.source, "scripts/container.sh"), "--which"],
                           capture_output=True, text=True)
    if which.returncode != 0:
        print(f"skipped: {which.stderr.strip()}")
        sys.exit(77)
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
