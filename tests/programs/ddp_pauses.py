"""Multi-process data parallel training with torchrun, in the shape of pytorch/examples
(distributed/ddp-tutorial-series/multigpu_torchrun.py), on CPU with gloo.

    torchrun --standalone --nproc-per-node 2 ddp_pauses.py [total_epochs] [save_every] [--batch_size 32]

Two switches of this program's own (it knows nothing of any monitoring tool):

EXAMPLE_PAUSE=KIND:SECS[,KIND:SECS...]    at step EXAMPLE_PAUSE_STEP (default 5; a comma list, one step
                           per pause) rank 0 alone pauses, healthily:
    ckpt_stream:SECS   torch.save of the snapshot to a stream object without a .name (a slow
                       remote-storage stream: write() throttles to take SECS in total)
    ckpt_dcp:SECS      torch.distributed.checkpoint.save through a FileSystemWriter on slow
                       storage (collective: both ranks write their share, SECS each)
    eval:SECS          rank 0 alone validates (forward passes under no_grad) for SECS while
                       rank 1 goes on and waits in the next gradient all-reduce
    upload:SECS        rank 0 saves the snapshot, then uploads it with `curl` to a slow HTTP
                       server on 127.0.0.1 (started by this program): the work is in a child
    upload_sock:SECS   the same upload from rank 0's own process over a socket
EXAMPLE_FAULT=KIND:ARG     a real fault on rank 1:
    hang:STEP          rank 1 sleeps in its own code at STEP (never returns)
    worker_sleep:IDX   rank 1's DataLoader worker 0 sleeps in __getitem__ at its IDX-th sample
    onesided:STEP      rank 1 alone all-reduces a metric at STEP (on the metrics group that rank 0
                       never enters): both ranks wait until the collective timeout
EXAMPLE_STEPS (default 12) bounds the run.
"""

import argparse
import http.server
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def switch(name):
    kind, _, arg = os.environ.get(name, "").partition(":")
    return (kind or None), (float(arg) if arg else None)


def pauses():
    """{step: (kind, secs)} from EXAMPLE_PAUSE and EXAMPLE_PAUSE_STEP."""
    kinds = [p for p in os.environ.get("EXAMPLE_PAUSE", "").split(",") if p]
    steps = [int(s) for s in os.environ.get("EXAMPLE_PAUSE_STEP", "5").split(",") if s]
    out = {}
    for i, spec in enumerate(kinds):
        kind, _, secs = spec.partition(":")
        out[steps[i] if i < len(steps) else steps[-1] + 3 * (i - len(steps) + 1)] = (kind, float(secs))
    return out


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        g = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(20, generator=g), torch.rand(1, generator=g)) for _ in range(size)]
        self.fetched = 0

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        kind, at = switch("EXAMPLE_FAULT")
        if kind == "worker_sleep" and os.environ.get("RANK") == "1":
            info = torch.utils.data.get_worker_info()
            if info is not None and info.id == 0:
                if self.fetched == int(at):
                    time.sleep(3600)  # a read that never returns
                self.fetched += 1
        return self.data[index]


def make_model():
    return torch.nn.Sequential(
        torch.nn.Linear(20, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1),
    )


# --------------------------------------------------------------------- slow storage
class RemoteStream:
    """A write-only stream to slow remote storage: no name, no seek; bytes land in a local
    spool file at `rate` bytes/s (written in 64 KiB pieces, the way a network client sends)."""

    def __init__(self, spool_path, rate):
        self._fd = os.open(spool_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._rate = rate
        self.written = 0

    def write(self, data):
        view = memoryview(data).cast("B")
        for i in range(0, len(view), 65536):
            piece = view[i:i + 65536]
            os.write(self._fd, piece)
            time.sleep(len(piece) / self._rate)
        self.written += len(view)
        return len(view)

    def flush(self):
        pass

    def close(self):
        os.close(self._fd)


class ThrottledFile:
    """A file on slow storage (what a FUSE mount of a bucket looks like to a writer)."""

    def __init__(self, raw, rate):
        self.raw, self.rate = raw, rate

    def write(self, data):
        view = memoryview(data).cast("B")
        for i in range(0, len(view), 65536):
            piece = view[i:i + 65536]
            self.raw.write(piece)
            self.raw.flush()
            time.sleep(len(piece) / self.rate)
        return len(view)

    def tell(self):
        return self.raw.tell()

    def fileno(self):
        return self.raw.fileno()

    def flush(self):
        self.raw.flush()

    def close(self):
        self.raw.close()


def slow_storage_writer(path, rate):
    from contextlib import contextmanager

    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import FileSystem

    class SlowFileSystem(FileSystem):
        @contextmanager
        def create_stream(self, path, mode):
            with super().create_stream(path, mode) as stream:
                yield ThrottledFile(stream, rate) if "w" in mode else stream

    writer = FileSystemWriter(path)
    writer.fs = SlowFileSystem()
    return writer


# ------------------------------------------------------------------- upload server
class SlowUploadHandler(http.server.BaseHTTPRequestHandler):
    rate = 100_000

    def do_PUT(self):
        left = int(self.headers["Content-Length"])
        while left:
            chunk = self.rfile.read(min(left, 16384))
            if not chunk:
                break
            left -= len(chunk)
            time.sleep(len(chunk) / self.rate)
        self.send_response(201)
        self.end_headers()

    def do_GET(self):  # /quit
        self.send_response(200)
        self.end_headers()
        threading.Thread(target=self.server.shutdown, daemon=True).start()

    def log_message(self, *args):
        pass


def serve(port_file, rate):
    SlowUploadHandler.rate = rate
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowUploadHandler)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(port_file + ".tmp", port_file)
    idle = threading.Timer(900, server.shutdown)  # never outlive a run that died
    idle.daemon = True
    idle.start()
    server.serve_forever()


def start_upload_server(rate, workdir):
    """The 'remote' server: a process of its own, not a child of this rank (double fork)."""
    port_file = os.path.join(workdir, "upload.port")
    subprocess.run(["sh", "-c", f'"{sys.executable}" "{__file__}" --serve "{port_file}" {rate} </dev/null >/dev/null 2>&1 &'],
                   check=True)
    for _ in range(200):
        if os.path.exists(port_file):
            return int(open(port_file).read())
        time.sleep(0.05)
    raise RuntimeError("upload server did not start")


# ------------------------------------------------------------------------- trainer
class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, workdir):
        self.rank = int(os.environ["RANK"])
        self.model = DDP(model)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.workdir = workdir
        self.step = 0
        self.max_steps = int(os.environ.get("EXAMPLE_STEPS", "12"))
        self.pauses = pauses()
        self.metrics_group = dist.new_group(backend="gloo")
        self.upload_port = None
        uploads = [secs for kind, secs in self.pauses.values() if kind in ("upload", "upload_sock")]
        if uploads and self.rank == 0:
            self.upload_port = start_upload_server(self.snapshot_bytes() / uploads[0], workdir)

    def snapshot_bytes(self):
        return sum(t.numel() * t.element_size() for t in self.model.module.state_dict().values())

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        kind, at = switch("EXAMPLE_FAULT")
        if kind == "onesided" and self.rank == 1 and self.step == int(at):
            finite = torch.tensor([float(torch.isfinite(loss))])
            dist.all_reduce(finite, group=self.metrics_group)  # rank 0 never enters it
        loss.backward()
        self.optimizer.step()
        return loss

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            if self.step >= self.max_steps:
                return
            kind, at = switch("EXAMPLE_FAULT")
            if kind == "hang" and self.rank == 1 and self.step == int(at):
                time.sleep(3600)  # stuck in the program's own code
            loss = self._run_batch(source, targets)
            self.step += 1
            if self.step in self.pauses:
                self._pause(*self.pauses[self.step])
            if self.rank == 0:
                print(f"[GPU{self.rank}] Epoch {epoch} | Step {self.step} | loss {loss.item():.4f}", flush=True)

    # -------------------------------------------------------------- the healthy pauses
    def _pause(self, kind, secs):
        t0 = time.monotonic()
        if kind == "ckpt_dcp":  # collective: every rank writes its share
            import torch.distributed.checkpoint as dcp

            state = {"model": self.model.module.state_dict()}
            # the storage's bandwidth: the rank with the biggest share (DCP spreads replicated
            # tensors over ranks, whole tensors each) takes about SECS
            dcp.save(state, storage_writer=slow_storage_writer(os.path.join(self.workdir, "dcp"), self.snapshot_bytes() / secs))
        elif self.rank != 0:
            return
        elif kind == "ckpt_stream":
            stream = RemoteStream(os.path.join(self.workdir, "remote.spool"), self.snapshot_bytes() / secs)
            torch.save({"MODEL_STATE": self.model.module.state_dict(), "STEPS_RUN": self.step}, stream)
            stream.close()
        elif kind == "eval":
            self.validate(secs)
        elif kind in ("upload", "upload_sock"):
            path = os.path.join(self.workdir, "snapshot.pt")
            torch.save({"MODEL_STATE": self.model.module.state_dict(), "STEPS_RUN": self.step}, path)
            url = f"http://127.0.0.1:{self.upload_port}/snapshot.pt"
            if kind == "upload":
                subprocess.run(["curl", "-sS", "-f", "-T", path, url], check=True)
            else:
                self.put_over_socket(path)
        else:
            raise SystemExit(f"unknown EXAMPLE_PAUSE {kind}")
        print(f"[GPU{self.rank}] {kind} took {time.monotonic() - t0:.1f}s", flush=True)

    def validate(self, secs):
        self.model.eval()
        val = torch.rand(512, 20)
        deadline = time.monotonic() + secs
        n = 0
        with torch.no_grad():
            while time.monotonic() < deadline:
                for i in range(0, len(val), 64):
                    self.model.module(val[i:i + 64]).sum().item()
                n += 1
        self.model.train()
        print(f"[GPU{self.rank}] validation: {n} passes", flush=True)

    def put_over_socket(self, path):
        size = os.path.getsize(path)
        with socket.create_connection(("127.0.0.1", self.upload_port)) as s, open(path, "rb") as f:
            s.sendall(f"PUT /snapshot.pt HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {size}\r\n\r\n".encode())
            s.sendfile(f)
            reply = s.recv(1024)
        if not reply.startswith(b"HTTP/1.") or b" 201 " not in reply.split(b"\r\n")[0] + b" ":
            raise RuntimeError(f"upload failed: {reply[:80]!r}")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)
            if self.step >= self.max_steps:
                break
        if self.rank == 0 and self.upload_port:
            try:
                import urllib.request

                urllib.request.urlopen(f"http://127.0.0.1:{self.upload_port}/quit", timeout=5).read()
            except OSError:
                pass


def load_train_objs():
    train_set = MyTrainDataset(2048)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, pin_memory=False, shuffle=False,
                      sampler=DistributedSampler(dataset), num_workers=2)


def main(save_every, total_epochs, batch_size):
    dist.init_process_group(backend="gloo")
    workdir = os.environ.get("EXAMPLE_WORKDIR") or tempfile.mkdtemp(prefix="ddp_pauses.")
    os.makedirs(workdir, exist_ok=True)
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, workdir)
    trainer.train(total_epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], float(sys.argv[3]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", nargs="?", default=2, type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", nargs="?", default=1, type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size on each device (default: 32)")
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size)
