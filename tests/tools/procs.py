"""Process harness for tests that start the real binaries: every process started through a
ProcessGroup is stopped by its PID when the group exits, on every path (failures included).
Its directory (logs, port files, checkpoints) is removed when the group exits cleanly and kept,
named on stderr, when it exits with an exception (a failed assertion), for the post-mortem."""
import os
import shutil
import signal
import sys
import subprocess
import tempfile
import time


class ProcessGroup:
    def __init__(self):
        self.procs = []
        self.dir = tempfile.mkdtemp(prefix="summa-test-")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.stop_all()
        if exc_type is None:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print(f"ProcessGroup: kept {self.dir} (logs of the failed test)", file=sys.stderr)
        return False

    def start(self, name, argv, env=None):
        with open(os.path.join(self.dir, name + ".log"), "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, **(env or {})})
        proc.name = name
        proc.log_path = os.path.join(self.dir, name + ".log")
        self.procs.append(proc)
        return proc

    def log(self, proc):
        with open(proc.log_path, errors="replace") as f:
            return f.read()

    def wait_for_file(self, path, proc, seconds=30):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if os.path.exists(path):
                with open(path) as f:
                    text = f.read().strip()
                if text:
                    return text
            if proc.poll() is not None:
                raise AssertionError(f"{proc.name} exited with {proc.returncode}:\n{self.log(proc)}")
            time.sleep(0.05)
        raise AssertionError(f"{proc.name} did not write {path} within {seconds} s")

    def wait_for_log(self, proc, text, seconds=60):
        """The log of `proc` once it holds `text`; fails when `proc` exits first or `seconds` pass."""
        deadline = time.monotonic() + seconds
        while True:
            log = self.log(proc)
            if text in log:
                return log
            if proc.poll() is not None:
                raise AssertionError(f"{proc.name} exited with {proc.returncode} before it wrote {text!r}:\n{log}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{proc.name} did not write {text!r} within {seconds} s:\n{log}")
            time.sleep(0.05)

    def start_server(self, server_bin, *flags, name="server"):
        port_file = os.path.join(self.dir, f"{name}.port")
        proc = self.start(name, [server_bin, "--address=127.0.0.1:0",
                                 f"--port_file={port_file}", *flags])
        return proc, int(self.wait_for_file(port_file, proc))

    def wait(self, proc, seconds):
        try:
            return proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{proc.name} still running after {seconds} s:\n{self.log(proc)}")

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_until(what, predicate, seconds=60):
    """Polls `predicate` until it returns a true value (returned), for at most `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
