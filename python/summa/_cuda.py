"""GPU parameters for ParameterServerOptimizer: the flat weights and gradients live on the GPU
(the parameters and their .grad are views of them, as on the CPU), and the exchange reads and
writes pinned host copies. A partition's gradients go device-to-host on a side stream as soon as
backward has finished them (a copy that overlaps the rest of backward); a thread of this
module's waits for each copy and only then names the partition ready to the client. New weights
come back host-to-device on the same side stream, each partition when the first module that
needs it is about to run (the module's stream waits for that copy alone).
"""
import queue
import sys
import threading

import torch


class DeviceStaging:
    def __init__(self, flat_device_weights, device):
        self.device = device
        total = flat_device_weights.numel()
        self.stream = torch.cuda.Stream(device=device)
        self.host_weights = torch.empty(total, dtype=torch.float32, pin_memory=True)
        self.host_weights.copy_(flat_device_weights)
        # Two: a step's exchange reads one while the next backward's copies fill the other.
        self.host_grads = [torch.zeros(total, dtype=torch.float32, pin_memory=True) for _ in range(2)]
        self.current = 0
        self.uploaded = set()
        self._ready = queue.Queue()
        self._client = None
        self._thread = threading.Thread(target=self._hand_over, name="summa-d2h", daemon=True)
        self._thread.start()

    @property
    def host_grads_now(self):
        return self.host_grads[self.current]

    def next_buffer(self):
        """A new step's gradients go to the other host buffer."""
        self.current ^= 1
        self.uploaded = set()

    def download(self, client, k, offset, length, device_grads):
        """Partition k's gradients to the host, then ready(k) (on this module's thread, once
        the copy is done). Called from backward's hook."""
        self._client = client
        produced = torch.cuda.current_stream(self.device)
        done = torch.cuda.Event()
        with torch.cuda.stream(self.stream):
            self.stream.wait_stream(produced)
            self.host_grads_now[offset:offset + length].copy_(device_grads[offset:offset + length], non_blocking=True)
            done.record(self.stream)
        self._ready.put((k, done))

    def _hand_over(self):
        while True:
            k, done = self._ready.get()
            try:
                done.synchronize()  # releases the GIL
                self._client.ready(k)
            finally:
                self._ready.task_done()

    def drain(self):
        """Until every partition handed to download so far is copied and named ready (before the
        step is finished, or its host gradients pushed again)."""
        self._ready.join()

    def upload(self, k, offset, length, device_weights):
        """Partition k's new weights (in host_weights) to the device, before the current stream
        reads them."""
        if k in self.uploaded:
            return
        self.uploaded.add(k)
        copied = torch.cuda.Event()
        with torch.cuda.stream(self.stream):
            device_weights[offset:offset + length].copy_(self.host_weights[offset:offset + length], non_blocking=True)
            copied.record(self.stream)
        torch.cuda.current_stream(self.device).wait_event(copied)

    def move_host_gradients(self, shared, buffers):
        """The host gradient buffers become `buffers`, slices of `shared` (the shared-memory plane's
        values segment), registered with CUDA as pinned memory so that the copies from the device
        land straight in the memory the server sums. Kept as they are where CUDA refuses."""
        cudart = torch.cuda.cudart()
        if not hasattr(cudart, "cudaHostRegister"):
            return
        try:
            torch.cuda.check_error(cudart.cudaHostRegister(shared.data_ptr(), shared.numel() * shared.element_size(), 0))
        except RuntimeError as e:
            print(f"summa: the shared gradient buffers could not be pinned ({e}); the exchange copies them",
                  file=sys.stderr)
            return
        self._registered = shared  # pinned for the process's life
        for new, old in zip(buffers, self.host_grads):
            new.copy_(old)
        self.host_grads = buffers

    def upload_all(self, device_weights):
        device_weights.copy_(self.host_weights)
        self.uploaded = set()

    def download_all(self, device_grads):
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        self.host_grads_now.copy_(device_grads)
