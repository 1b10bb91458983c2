"""How `ups why` reads a log (ups.why.logread): its structure, on small texts built for each rule.

The texts are shaped like real output (tracebacks, NCCL and torchrun lines, CUDA footers), but
each checks one rule of the reading, so that a change that breaks a rule fails here by name:
a footer never decides; an INFO line never decides; a warning never decides; the innermost
cause wins; the first rank to fail wins; a symptom yields to its cause; an unknown text says
it is unknown; the program's own error is "your code raised X at file:line". How right the
reader is on real excerpts it was not tuned on is scripts/bench_why_corpus.py's figure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import run_ups

from ups.why.loaderwords import EXITED, named_workers, worker_deaths
from ups.why.logread import BY_NAME, CLASSES, read_log

pytestmark = pytest.mark.notorch  # also run on each other Python, without torch (tests/test_pythons.py)

FOOTER = """CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""


def tb(*frames: str, error: str) -> str:
    """A traceback: frames as (path:line:function) strings, then the exception line."""
    lines = ["Traceback (most recent call last):"]
    for f in frames:
        path, line, fn = f.split(":")
        lines += [f'  File "{path}", line {line}, in {fn}', "    pass"]
    return "\n".join(lines + [error]) + "\n"


# -- footers, INFO lines and warnings are context ---------------------------------------------------
def test_a_footer_never_decides():
    # PyTorch prints the same footer under every CUDA error; it names device-side assertions.
    ecc = read_log("RuntimeError: CUDA error: uncorrectable ECC error encountered\n" + FOOTER)
    assert ecc.name == "gpu_ecc"
    kernel = read_log("RuntimeError: CUDA error: no kernel image is available for execution on the device\n" + FOOTER)
    assert kernel.name == "cuda_no_kernel_image"
    # ... also when a capture joined it to the error's line
    one_line = read_log("CUDA error: no kernel image is available for execution on the device " + FOOTER.replace("\n", " "))
    assert one_line.name == "cuda_no_kernel_image"
    alone = read_log(FOOTER)
    assert alone.cls is None and not alone.failed


def test_an_info_line_never_decides():
    info = """node1:26023:26023 [0] NCCL INFO Bootstrap : Using eth0:172.17.2.7<0>
node1:26023:26023 [0] NCCL INFO NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared object file: No such file or directory : when loading libnccl-net.so
node1:26023:26023 [0] NCCL INFO NET/Plugin: Using internal network plugin.
[2024-04-18 10:46:28,089] [INFO] [comm.py:652:init_distributed] Out of memory checks disabled; No space left on device is not an error here
08/07/2021 02:16:27 - INFO - __main__ -   Killed 0 stale workers
"""
    assert not read_log(info).failed
    # ... and the error after them is what decides
    failed = read_log(info + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)\n")
    assert failed.name == "cuda_oom" and failed.line.startswith("torch.OutOfMemoryError")


def test_a_warning_never_decides():
    warning = """/opt/venv/lib/python3.11/site-packages/torch/cuda/__init__.py:174: UserWarning: CUDA initialization: The NVIDIA driver on your system is too old (found version 11040).
  return torch._C._cuda_getDeviceCount() > 0
/opt/venv/lib/python3.11/site-packages/torchvision/io/image.py:13: UserWarning: Failed to load image Python extension: libc10_cuda.so: cannot open shared object file: No such file or directory
  warn(
[W socket.cpp:663] [c10d] The client socket cannot be initialized to connect to [localhost]:29500 (errno: 97 - Address family not supported by protocol).
epoch 1 loss 0.41
"""
    assert not read_log(warning).failed


def test_an_error_the_program_says_it_caught_never_decides():
    notice = "A matching Triton is not available, some optimizations will not be enabled.\nError caught was: No module named 'triton'\n"
    assert not read_log(notice).failed
    assert read_log("Ignoring exception: [Errno 28] No space left on device\nepoch 2 loss 0.3\n").kind == "none"
    # Python's "Exception ignored in:" prints the exception on a line of its own: that one is read
    unraisable = "Exception ignored in: <_io.TextIOWrapper name='<stdout>' mode='w'>\nOSError: [Errno 122] Disk quota exceeded\n"
    assert read_log(unraisable).name == "disk_quota"
    assert read_log("ModuleNotFoundError: No module named 'triton'\n").name == "import_error"


# -- causes and their order -------------------------------------------------------------------------
def test_the_innermost_cause_wins():
    during = tb("/home/u/train.py:40:save", "/opt/venv/lib/python3.11/site-packages/torch/serialization.py:850:_save",
                error="OSError: [Errno 28] No space left on device") + \
        "\nDuring handling of the above exception, another exception occurred:\n\n" + \
        tb("/home/u/train.py:44:save", error="RuntimeError: CUDA error: out of memory")
    reading = read_log(during)
    assert reading.name == "disk_full" and reading.site == "train.py:40"
    direct = tb("/home/u/data.py:12:load", error="FileNotFoundError: [Errno 2] No such file or directory: 'shard-7.h5'") + \
        "\nThe above exception was the direct cause of the following exception:\n\n" + \
        tb("/home/u/train.py:9:main", error="RuntimeError: DataLoader worker (pid 4321) is killed by signal: Killed.")
    assert read_log(direct).name == "file_missing"


def test_the_first_rank_to_fail_wins_by_its_own_clock():
    # Printed out of order (two ranks' output interleaved): rank 0's line comes second but
    # its timestamp is earlier.
    text = """[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.
[rank0]:[E626 06:24:44.159932949 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600030 milliseconds before timing out.
"""
    reading = read_log(text)
    assert reading.name == "collective_timeout" and reading.rank == 0


def test_a_symptom_yields_to_its_cause():
    # rank 0 saw its peer go; rank 1 ran out of GPU memory first: the peer is the cause.
    text = """[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4005
[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB (GPU 1; 79.1 GiB total capacity)
"""
    reading = read_log(text)
    assert reading.name == "cuda_oom" and reading.rank == 1
    # ... and to the program's own error, when that came first
    own = tb("/home/u/train.py:30:main", error="[rank1]: ValueError: Expected input batch_size (16) to match target batch_size (8).")
    assert read_log(own.replace('  File', '[rank1]:   File') + text.splitlines()[0] + "\n").kind == "user_code"
    # ... and when it came after: a peer's traceback is often printed after the survivor's (a
    # Lightning job's rank 1 lost rank 0, whose DataLoader workers the OOM killer took)
    lost = ("[rank1]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
            "[127.0.0.1]:18648. This is typically caused by a remote worker crashing.\n")
    died = tb("/home/u/lit.py:58:main", "/venv/torch/utils/data/dataloader.py:1304:_try_get_data",
              error="RuntimeError: DataLoader worker (pid(s) 4333, 4336) exited unexpectedly")
    died = "".join(f"[rank0]: {line}\n" for line in died.splitlines())
    for log in (lost + died, died + lost):
        reading = read_log(log)
        assert reading.rank == 0 and "DataLoader worker (pid(s) 4333, 4336) exited unexpectedly" in reading.line, reading
    # ... but alone it is named
    assert read_log(text.splitlines()[0]).name == "peer_lost"


def test_the_dataloaders_word_on_a_dead_worker_explains_the_error_it_caught():
    # CI at 36dc6dd: a worker SIGKILLed while rank 0 rebuilt a tensor it had sent; the refused
    # connection is printed first, as the chain's cause, then torch's own finding.
    caught = tb("/venv/torch/multiprocessing/reductions.py:538:rebuild_storage_fd",
                "/usr/lib/python3.11/multiprocessing/connection.py:646:SocketClient",
                error="ConnectionRefusedError: [Errno 111] Connection refused")
    found = tb("/home/u/lit.py:58:main", "/venv/torch/utils/data/dataloader.py:1304:_try_get_data",
               error="RuntimeError: DataLoader worker (pid(s) 16813, 16814) exited unexpectedly")
    chain = caught + "\nThe above exception was the direct cause of the following exception:\n\n" + found
    reading = read_log("".join(f"[rank0]: {line}\n" for line in chain.splitlines()))
    assert reading.rank == 0 and "DataLoader worker (pid(s) 16813, 16814) exited unexpectedly" in reading.line, reading


def test_torchs_two_sentences_on_a_dead_dataloader_worker_are_read_in_one_place():
    # torch 2.x's SIGCHLD handler and its loader's own finding, as a rank prints them under torchrun
    text = ("[rank0]: RuntimeError: DataLoader worker (pid 30919) is killed by signal: Killed.\n"
            "[rank1]: RuntimeError: DataLoader worker (pid(s) 16813, 16814) exited unexpectedly\n")
    assert worker_deaths(text) == [([30919], "killed by signal: Killed"), ([16813, 16814], EXITED)]
    assert named_workers(text) == {30919} and named_workers("no worker here") == set()
    assert worker_deaths("DataLoader worker process 0 raised") == []


def test_a_more_specific_reading_of_one_event_wins():
    dup = """torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.20.5
ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
Last error:
Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 10
"""
    assert read_log(dup).name == "duplicate_gpu"
    # NCCL writes no file but its shared-memory segments: its "No space left" is /dev/shm's.
    shm = "node1:100:200 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device\n"
    assert read_log(shm).name == "shm_full"
    assert read_log("OSError: [Errno 28] No space left on device: '/data/ckpt/model.pt'\n").name == "disk_full"


def test_an_error_the_program_noted_and_went_on_after_yields_to_the_exception_that_ended_it():
    note = "apex not installed: No module named 'apex', using torch.amp\n"
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.6 GiB total capacity)\n"
    assert read_log(note + "epoch 1 loss 0.3\n" + oom).name == "cuda_oom"
    assert read_log(note).name == "import_error"  # alone, it is all there is
    missing = "could not read [Errno 2] No such file or directory: 'configs/local.yaml', using defaults\n"
    assert read_log(missing + oom).name == "cuda_oom"
    # the exception that ended it naming the same class is that class
    assert read_log(note + "ModuleNotFoundError: No module named 'flash_attn'\n").name == "import_error"


# torchrun's report of a run whose rank 3 was SIGKILLed.
CHILD = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-02-09_09:09:15
  host      : node1
  rank      : 3 (local_rank: 3)
  exitcode  : -9 (pid: 170581)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 170581
============================================================
"""


def test_where_an_error_was_raised_says_which_device_is_full():
    error = "OSError: [Errno 28] No space left on device"
    semaphore = tb("/home/u/train.py:80:main", "/usr/lib/python3.10/multiprocessing/context.py:68:Lock",
                   "/usr/lib/python3.10/multiprocessing/synchronize.py:57:__init__", error=error)
    assert read_log(semaphore).name == "shm_full"  # a POSIX semaphore lives in /dev/shm
    save = tb("/home/u/train.py:80:main", "/opt/venv/lib/python3.11/site-packages/torch/serialization.py:850:_save",
              error=error)
    assert read_log(save).name == "disk_full"
    # a frame further out does not say where it was raised
    outer = tb("/usr/lib/python3.10/multiprocessing/process.py:108:run", "/home/u/train.py:80:main",
               "/opt/venv/lib/python3.11/site-packages/torch/serialization.py:850:_save", error=error)
    assert read_log(outer).name == "disk_full"


def test_how_a_process_ended_decides_only_when_nothing_says_more():
    reading = read_log(CHILD)
    assert reading.name == "oom_killed" and reading.rank == 3
    said = read_log("RuntimeError: DataLoader worker (pid 4499) is killed by signal: Bus error.\n" + CHILD)
    assert said.name == "shm_full" and said.rank == 3  # the rank torchrun names, the cause the worker's death says


def test_a_rank_killed_explains_its_peers_errors_but_an_abort_does_not():
    peer = "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4005\n"
    child = CHILD.replace("exitcode  : -9", "exitcode  : {code}").replace("Signal 9 (SIGKILL)", "{signal}")
    killed = read_log(peer + child.format(code=-11, signal="Signal 11 (SIGSEGV)"))
    assert killed.name == "segfault" and killed.rank == 3  # rank 3 crashed; rank 0 only lost it
    timeout = "[rank1]:[E ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.\n"
    aborted = read_log(timeout + child.format(code=-6, signal="Signal 6 (SIGABRT)"))
    assert aborted.name == "collective_timeout" and aborted.rank == 1  # the watchdog's abort is how it ended, not why
    # faulthandler's report of the abort comes before the error that caused it, and still does not decide
    fatal = read_log("Fatal Python error: Aborted\n\nExtension modules: numpy.core._multiarray_umath, torch._C\n"
                     "[E ProcessGroupNCCL.cpp:916] [Rank 0] NCCL watchdog thread terminated with exception: "
                     "CUDA error: an illegal memory access was encountered\n")
    assert fatal.name == "cuda_illegal_memory_access"
    assert read_log("Fatal Python error: Aborted\n").name == "segfault"  # alone, how it ended is all there is
    assert read_log("Fatal Python error: Segmentation fault\n\nThread 0x7f (most recent call first):\n"
                    "RuntimeError: DataLoader worker (pid 4499) exited unexpectedly\n").name == "segfault"


def test_the_first_nccl_warn_of_a_process_is_its_root():
    text = """a100-22:183006:183220 [1] misc/socket.cc:518 NCCL WARN Net : Call to recv from 10.200.84.247<58355> failed : Broken pipe
a100-22:183006:183220 [1] NCCL INFO misc/socket.cc:535 -> 6
a100-22:183006:183220 [1] proxy.cc:1119 NCCL WARN [Proxy Service 9] Failed to execute operation Connect from rank 9, retcode 6
"""
    assert read_log(text).name == "peer_lost"  # the proxy's failed Connect follows from the peer gone
    assert read_log(text.splitlines()[2]).name == "nccl_network"  # alone, it is the network


# -- how lines are read -----------------------------------------------------------------------------
def test_a_hard_wrapped_line_is_read_as_one():
    said = ("[rank6]:[F ProcessGroupNCCL.cpp:1169] [PG 0 Rank 6] ProcessGroupNCCL's watchdog got stuck for 600 seconds "
            "without making progress in monitoring enqueued collectives. This typically indicates a NCCL/CUDA API hang.")
    wrapped = "\n".join(said[k:k + 104] for k in range(0, len(said), 104))
    assert "600 second\n" in wrapped and wrapped.count("\n") == 2  # the wrap cuts the sign's words
    reading = read_log(wrapped + "\nsrun: error: node1: task 6: Aborted\n")
    assert reading.name == "nccl_heartbeat" and reading.rank == 6 and reading.n == 0
    # Lines of one width that each start a line of their own (a rank's, NCCL's) stay lines.
    same = ["[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered",
            "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered"]
    assert read_log("\n".join(same) + "\n").rank == 0


def test_a_paste_wrapped_at_one_width_is_read_unwrapped():
    lines = [f"[rank{r}]:[E ProcessGroupNCCL.cpp:1182] [Rank {r}] NCCL watchdog thread terminated with exception: [Rank {r}] "
             f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1{r}, OpType=ALLREDUCE, NumelIn=112, "
             f"NumelOut=112, Timeout(ms)=1800000) ran for 1800010 milliseconds before timing out." for r in range(3)]
    wrapped = "\n".join(line[k:k + 90] for line in lines for k in range(0, len(line), 90))
    reading = read_log(wrapped)
    assert reading.name == "collective_timeout" and reading.rank == 0


def test_one_line_repeated_and_wrapped_each_time_is_read_unwrapped():
    # a kernel's assertion printed by many threads: the same long line, each wrapped at the
    # terminal's width, the cut falling after a comma or inside a word
    lines = [f"/pytorch/aten/src/ATen/native/cuda/Loss.cu:250: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], "
             f"thread: [{t},0,0] Assertion `t >= 0 && t < n_classes` failed." for t in range(12, 16)]
    width = lines[0].index("block: [0,") + len("block: [0,")
    wrapped = "\n".join(line[k:k + width] for line in lines for k in range(0, len(line), width))
    assert wrapped.splitlines()[0].endswith("block: [0,") and wrapped.count("\n") == 7
    assert read_log(wrapped).name == "cuda_device_assert"
    wrapped = "\n".join(line[k:k + 84] for line in lines for k in range(0, len(line), 84))  # "..._kernel_" / "2d: ..."
    assert read_log(wrapped).name == "cuda_device_assert"
    retry = "node3:7001:7050 [0] NCCL INFO Call to connect returned Connection refused, retrying"
    assert read_log("\n".join(retry[k:k + 70] for _ in range(3) for k in range(0, len(retry), 70))).name == "nccl_network"
    retry = retry.replace("node3", "gpu-node-017.cluster.internal")
    at_space = retry.index("returned")  # the cut falls on the space before a word
    assert read_log("\n".join(retry[k:k + at_space] for _ in range(3) for k in range(0, len(retry), at_space))).name == \
        "nccl_network"


def test_the_rest_of_a_wrapped_info_line_is_still_context():
    info = ("node1:26023:26023 [0] NCCL INFO NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: cannot o\n"
            "pen shared object file: No such file or directory\n"
            "node1:26023:26023 [0] NCCL INFO NET/Plugin : No plugin found, using internal implementation\n")
    assert not read_log(info).failed
    after = info + "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error\n"
    assert read_log(after).name == "nccl_system_error"


def test_a_coloured_loggers_escape_sequences_are_not_read():
    text = ("\x1b[1;31mncclInvalidUsage\x1b[0m: This usually reflects invalid usage of NCCL library.\n"
            "\x1b[31mLast error:\x1b[0m\n\x1b[31mDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000\x1b[0m\n")
    assert read_log(text).name == "duplicate_gpu"
    assert read_log("\x1b[31mOSError: [Errno 24] Too many open files\x1b[0m\n").name == "too_many_open_files"


def test_a_paste_from_a_web_pages_html_or_a_strings_repr_is_read_as_printed():
    shm = "RuntimeError: unable to write to file &lt;/torch_18533_1951271766_0&gt;: No space left on device (28)\n"
    assert read_log(shm).name == "shm_full"
    escaped = tb("/home/u/train.py:12:main", "/home/u/data.py:40:load", error="ValueError: bad split &#39;tes&#39;")
    reading = read_log(escaped.replace('"', "&quot;"))
    assert reading.kind == "user_code" and reading.site == "data.py:40"
    quoted = read_log(tb("/home/u/train.py:12:main", "/home/u/data.py:40:load", error="ValueError: bad").replace('"', '\\"'))
    assert quoted.kind == "user_code" and quoted.site == "data.py:40"


@pytest.mark.parametrize("label", ["stderr: ", "trainer-1  | ", "trainer_1  | ", "[pod/trainer-0/main] "])
def test_a_capture_tools_label_on_every_line_is_a_prefix(label: str):
    # a subprocess capture's stream, docker compose's service, kubectl --prefix's pod
    text = tb("/home/u/train.py:12:main", "/home/u/data.py:40:load", error="ValueError: bad split 'tes'")
    reading = read_log("".join(label + line + "\n" for line in text.splitlines()))
    assert reading.kind == "user_code" and reading.site == "data.py:40"
    nccl = ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, invalid usage, NCCL version "
            "2.20.5\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n"
            "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000\n")
    assert read_log("".join(label + line + "\n" for line in nccl.splitlines())).name == "duplicate_gpu"


RICH = """╭─────────────────────────── Traceback (most recent call last) ────────────────────────────╮
│ /home/u/train.py:42 in main                                                                │
│                                                                                            │
│   40 │   │   if os.statvfs(out).f_bavail == 0:                                               │
│   41 │   │   │   raise OSError("No space left on device")                                    │
│ ❱ 42 │   │   loss = model(batch)                                                           │
│                                                                                            │
│ /opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py:1511 in _call_impl       │
╰────────────────────────────────────────────────────────────────────────────────────────────╯
{error}
"""


def test_richs_boxed_traceback_is_frames_and_code():
    # the box's lines are frames and their code: words in the code decide nothing
    own = read_log(RICH.format(error="KeyError: 'label'"))
    assert own.kind == "user_code" and own.exception == "KeyError" and own.site == "train.py:42"
    oom = read_log(RICH.format(error="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert oom.name == "cuda_oom" and oom.site == "train.py:42"


def test_a_rich_frame_row_wrapped_past_the_box_is_one_frame():
    # a path longer than the box goes on a row of its own, its line and function on the next;
    # the paste may also cut the box's top
    box = ("│    181 │   if location.startswith('cuda'):                                                │\n"
           "│                                                                                            │\n"
           "│ C:\\Users\\u\\AppData\\Local\\Programs\\Python\\Python310\\lib\\site-packages\\torch\\serialization.py: │\n"
           "│ {line} in {fn}                                                                    │\n"
           "│                                                                                            │\n"
           "│ ❱  182 │   │   device = validate_cuda_device(location)                                     │\n")
    reading = read_log(box.format(line="182", fn="_cuda_deserialize"))
    assert reading.name == "checkpoint_cuda_on_cpu" and reading.site == "serialization.py:182"
    # ... with a rank's label on each row
    labelled = "".join("[rank0]: " + x + "\n" for x in box.format(line="182", fn="_cuda_deserialize").splitlines())
    assert read_log(labelled).name == "checkpoint_cuda_on_cpu"
    # ... read by where it stopped like any frame: another function of the same file says nothing
    assert read_log(box.format(line="1020", fn="_legacy_save")).name is None
    # a row that is a path alone, with words after it, is no frame
    words = box.replace("│ {line} in {fn}", "│ is where the checkpoint was").format()
    assert read_log(words).name is None


def test_a_jupyter_cell_is_the_programs_own_frame():
    text = ("---------------------------------------------------------------------------\n"
            "ValueError                                Traceback (most recent call last)\n"
            "Cell In[7], line 3\n      1 model = Net()\n----> 3 out = model(x)\n\n"
            "File /opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py:1511, in Module._call_impl(self, *args)\n"
            "-> 1511     return forward_call(*args, **kwargs)\n\n"
            "ValueError: Expected input batch_size (4) to match target batch_size (8).\n")
    reading = read_log(text)
    assert reading.kind == "user_code" and reading.site == "Cell In[7]:3"


def test_a_launchers_host_label_is_a_prefix_only_before_another():
    # pdsh / DeepSpeed's launcher label each line with its host; NCCL's own prefix follows.
    trace = "".join(f"worker-1: worker-1:10793:11394 [1] NCCL INFO {site} -> 2\n"
                    for site in ("bootstrap.cc:270", "init.cc:1303", "group.cc:64"))
    assert read_log(trace).name == "nccl_system_error"  # a return code is read on NCCL's INFO lines
    assert read_log("worker-1: worker-1:10793:11394 [1] NCCL INFO Bootstrap : Using eth0\n").kind == "none"
    # "Word: " before words is a message, not a label
    assert read_log("Error: disk quota exceeded while writing the checkpoint\n").name == "disk_quota"


def test_nccls_explanation_is_read_across_blank_lines():
    text = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage "
            "(run with NCCL_DEBUG=WARN for details), NCCL version 2.20.5\nncclInvalidUsage: This usually reflects invalid usage "
            "of NCCL library.\nLast error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000\n")
    assert read_log(text).name == "duplicate_gpu"
    assert read_log(text.replace("\n", "\n\n")).name == "duplicate_gpu"  # a paste that double-spaces lines


def test_srun_labels_a_tracebacks_indented_lines_too():
    text = "\n".join(f"3: {line}" for line in tb("/home/u/train.py:12:main", "/home/u/data.py:40:load",
                                                 error="ValueError: bad split 'tes'").splitlines())
    reading = read_log(text)
    assert reading.kind == "user_code" and reading.rank == 3 and reading.site == "data.py:40"


def test_a_slurm_cancel_names_the_job_and_why_and_a_user_signal_is_the_job_stopped_from_outside():
    # slurmstepd's and srun's lines as slurm-wlm 22.05 wrote them (tests/test_slurm.py makes them for real)
    cancel = ("step 26 loss 0.97\nsrun: Job step aborted: Waiting up to 4 seconds for job step to finish.\n"
              "slurmstepd-vm: error: *** STEP 7.0 ON vm CANCELLED AT 2026-12-01T20:34:29 ***\n"
              "slurmstepd-vm: error: *** JOB 7 ON vm CANCELLED AT 2026-12-01T20:34:29 DUE TO TIME LIMIT ***\n")
    got = read_log(cancel)
    assert got.name == "job_terminated" and "(SLURM job 7 on vm cancelled at 2026-12-01T20:34:29 due to time limit)" in got.summary
    assert "SLURM job 7 on vm cancelled at 2026-12-01T20:34:29 by scancel" in read_log(cancel.replace(" DUE TO TIME LIMIT", "")).summary
    usr1 = read_log("up\nsrun: error: vm: tasks 0-1: User defined signal 1\n")
    assert usr1.name == "job_terminated" and "SLURM job" not in usr1.summary
    assert read_log("the flag says: User defined signal 1 handler installed\n").name is None


def test_sagemakers_mpirun_tags_and_a_container_runtimes_log_lines_are_prefixes():
    trace = tb("/opt/ml/code/train.py:12:main", "/opt/ml/code/data.py:40:load", error="KeyError: 'label'").splitlines()
    sagemaker = "\n".join(f"[1,mpirank:2,algo-1]<stderr>:{line}" for line in trace)
    reading = read_log(sagemaker)
    assert reading.kind == "user_code" and reading.rank == 2 and reading.site == "data.py:40"
    cri = "\n".join(f"2024-05-01T10:00:00.123456789Z stderr F {line}" for line in trace)
    assert read_log(cri).kind == "user_code"
    # a line that only starts with the word is not prefixed
    assert read_log("stderr F-score dropped to 0.1\n").kind == "none"


def test_vllms_worker_label_is_a_rank_and_its_log_layout_a_level():
    head = "(VllmWorker rank=1 pid=12231) ERROR 03-25 21:13:53 multiproc_executor.py:374] "
    trace = tb("/opt/venv/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py:1036:capture_model",
               "/home/u/my_model.py:88:load_weights", error="KeyError: 'model.layers.0.mlp'").splitlines()
    text = "".join(head + line + "\n" for line in trace)
    reading = read_log(text)
    assert reading.kind == "user_code" and reading.rank == 1 and reading.site == "my_model.py:88"
    # the newer layout, and its INFO lines are context
    info = "INFO 05-07 02:57:53 [__init__.py:239] Automatically detected platform cuda. Out of memory checks are off.\n"
    new = info + "".join("ERROR 06-10 03:43:37 [core.py:500] " + line + "\n" for line in trace)
    assert read_log(new).kind == "user_code"
    assert not read_log(info).failed


# Libraries' message templates, filled in as they print them (not any one thread's words).
TEMPLATES = [
    ("collective_mismatch", "horovod.common.exceptions.HorovodInternalError: Mismatched ALLGATHER tensor shapes: One rank sent a "
                            "tensor of rank 2, but another rank sent a tensor of rank 3."),
    ("collective_mismatch", "tensorflow.python.framework.errors_impl.FailedPreconditionError: Mismatched data types: One rank had "
                            "type float32, but another rank had type float16."),
    ("collective_mismatch", "accelerate.utils.operations.DistributedOperationException: Cannot apply desired operation due to "
                            "shape mismatches. All shapes across devices must be valid."),
    ("gpu_lost", "kernel: NVRM: GPU0 nvCheckOkFailedNoLog: Check failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST] (0x0000000F)"),
    ("job_terminated", "Job deleted at request of root@headnode.local"),
    ("oom_killed", "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n=   PID 4211 RUNNING AT node3\n=   EXIT CODE: 9\n"
                   "=   CLEANING UP REMAINING PROCESSES"),
    # the accelerator's memory, as other runtimes and devices say it
    ("cuda_oom", "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
                 "shape[64,512,512] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc"),
    ("cuda_oom", "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 60.97 GiB total capacity)"),
    # shells and launchers saying how a process ended
    ("oom_killed", "zsh: killed     python train.py --batch-size 64"),
    ("segfault", "mpirun noticed that process rank 3 with PID 4412 on node n07 exited on signal 11."),
    ("job_terminated", "subprocess.CalledProcessError: Command '['/usr/bin/python', 'train.py']' died with "
                       "<Signals.SIGTERM: 15>."),
    # schedulers' time limits
    ("job_terminated", "=>> PBS: job killed: walltime 86410 exceeded limit 86400"),
    ("job_terminated", "TERM_RUNLIMIT: job killed after reaching LSF run time limit."),
    ("disk_full", "OSError: [WinError 112] There is not enough space on the disk"),
    # Windows' words for host memory and a crash
    ("host_oom", "OSError: [WinError 1455] The paging file is too small for this operation to complete. Error loading "
                 "\"C:\\venv\\lib\\site-packages\\torch\\lib\\cudnn_cnn_infer64_8.dll\" or one of its dependencies."),
    ("segfault", "Windows fatal exception: access violation\n\nCurrent thread 0x00001a2c (most recent call first):"),
    ("segfault", "Process finished with exit code -1073741819 (0xC0000005)"),
    # NCCL's error codes as older torch prints them
    ("peer_lost", "RuntimeError: NCCL Error 6: remote process exited or there was a network error"),
    ("nccl_invalid_usage", "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:784, NCCL Error 5"),
    # Windows, ROCm, Kubernetes and the kernel saying a known thing in their own words
    ("address_in_use", "OSError: [WinError 10048] Only one usage of each socket address (protocol/network address/port) "
                       "is normally permitted"),
    ("cuda_illegal_memory_access", "Memory access fault by GPU node-2 (Agent handle: 0x55d1c0a0) on address "
                                   "0x7f3a00000000. Reason: Page not present or supervisor privilege."),
    ("cuda_no_kernel_image", "RuntimeError: HIP error: invalid device function"),
    ("cuda_no_kernel_image", "rocBLAS error: hipErrorNoBinaryForGpu: Unable to find code object for all current devices!"),
    ("oom_killed", "Message: The node was low on resource: memory. Container trainer was using 61Gi, which exceeds its "
                   "request of 32Gi."),
    ("disk_full", "Message: The node was low on resource: ephemeral-storage. Container trainer was using 212Gi."),
    ("oom_killed", "[88213.402118] oom_reaper: reaped process 40211 (python), now anon-rss:0kB, file-rss:0kB"),
    # schedulers and a notebook host killing for memory; HF datasets' disk check; NCCL's shm segment
    ("oom_killed", "=>> PBS: job killed: mem 38427376kb exceeded limit 33554432kb"),
    ("oom_killed", "=>> PBS: job killed: vmem 3372163072 exceeded limit 2147483648"),
    ("oom_killed", "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit."),
    ("oom_killed", "Your session crashed after using all available RAM. If you are interested in access to high-RAM runtimes, "
                   "you may want to check out Colab Pro."),
    ("disk_full", "OSError: Not enough disk space. Needed: 12.43 GiB (download: 5.20 GiB, generated: 7.23 GiB, post-processed: "
                  "Unknown size)"),
    ("shm_full", "node1:511:602 [0] include/shm.h:48 NCCL WARN Error: failed to extend /dev/shm/nccl-6wbP8B to 9637892 bytes"),
    ("shm_full", "ERROR: Unexpected BUS error encountered in DataLoader worker. This might be caused by insufficient shared memory"),
    # weights that are no weights: a Git LFS pointer, a truncated or foreign HDF5 file
    ("checkpoint_corrupt", "OSError: You seem to have cloned a repository without having git-lfs installed. Please install "
                           "git-lfs and run `git lfs install` followed by `git lfs pull` in the folder you cloned."),
    ("checkpoint_corrupt", "OSError: Unable to open file (truncated file: eof = 96468992, sblock->base_addr = 0, stored_eof = "
                           "553457328)"),
    ("checkpoint_corrupt", "OSError: Unable to synchronously open file (file signature not found)"),
    # torch's shared tensors live in /dev/shm, whatever the call that failed on them
    ("shm_full", "RuntimeError: unable to open shared memory object </torch_4120_2871823_3> in read-write mode: No space "
                 "left on device (28)"),
]


def test_a_batch_of_unequal_samples_is_the_programs_own_error():
    # the default collate stacks the samples: samples of different sizes are the dataset's (the program's) doing
    text = tb("/home/u/train.py:40:main", "/opt/venv/lib/python3.11/site-packages/torch/utils/data/_utils/collate.py:214:"
              "collate_tensor_fn", error="RuntimeError: stack expects each tensor to be equal size, but got [62] at entry 0 "
                                         "and [63] at entry 1")
    reading = read_log(text)
    assert reading.kind == "user_code" and reading.exception == "RuntimeError"
    # ... a RuntimeError from the same frame that says nothing of the sizes is unknown
    other = text.replace("stack expects each tensor to be equal size, but got [62] at entry 0 and [63] at entry 1",
                         "unexpected storage device in the batch")
    assert read_log(other).kind == "unknown"


@pytest.mark.parametrize(("name", "text"), TEMPLATES, ids=[f"{n}:{k}" for k, (n, _) in enumerate(TEMPLATES)])
def test_a_librarys_message_template_is_named(name: str, text: str):
    assert read_log(text + "\n").name == name


def test_an_autograd_dtype_error_is_the_programs_own():
    reading = read_log(tb("/home/u/train.py:88:main", "/opt/venv/lib/python3.11/site-packages/torch/autograd/__init__.py:266:backward",
                          error="RuntimeError: Found dtype Long but expected Float"))
    assert reading.kind == "user_code" and reading.exception == "RuntimeError"


def test_a_python_warnings_message_is_read_by_the_signs_a_warning_may_show():
    # torch's warnings start their message on the line after "UserWarning:"; on that line or
    # the next, the message is a notice: a sign that a warning may show reads it ...
    header = "/opt/venv/lib/python3.10/site-packages/torch/cuda/__init__.py:146: UserWarning: "
    message = ("NVIDIA GeForce RTX 4090 with CUDA capability sm_89 is not compatible with the current PyTorch installation.\n"
               "The current PyTorch install supports CUDA capabilities sm_37 sm_50 sm_60 sm_70.\n")
    cut = tb("/home/u/run.py:20:main", "/opt/venv/lib/python3.10/site-packages/torch/nn/modules/linear.py:96:__init__",
             error="").rstrip("\n")
    for text in (header + "\n" + message, header + message):
        reading = read_log(text + "  warnings.warn(incompatible_device_warn.format(device_name, capability))\n" + cut)
        assert reading.name == "cuda_no_kernel_image", text
    old = ("/opt/venv/lib/python3.8/site-packages/torch/cuda/__init__.py:120: UserWarning:\n"
           "    Found GPU0 NVIDIA GeForce GT 710 which is of cuda capability 3.5.\n"
           "    PyTorch no longer supports this GPU because it is too old.\n"
           "    The minimum cuda capability supported by this library is 3.7.\n\n  warnings.warn(old_gpu_warn % (d, name, major, minor, min_arch // 10, min_arch % 10))\n")
    assert read_log(old + cut).name == "cuda_no_kernel_image"
    # ... and an error that says more still decides
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.6 GiB total capacity)\n"
    assert read_log(header + "\n" + message + oom).name == "cuda_oom"
    # ... but no other sign: a warning that quotes an error is not that error
    quoted = ("/opt/venv/lib/python3.10/site-packages/datasets/builder.py:88: UserWarning:\n"
              "Could not cache the index: [Errno 28] No space left on device\nepoch 1 loss 0.7\n")
    assert not read_log(quoted).failed


def test_a_line_in_markdown_emphasis_is_read_as_its_text():
    assert read_log("step 1200 loss 0.31\n\n**Killed**\n").name == "oom_killed"
    assert read_log("step 1200 loss 0.31\n`Segmentation fault (core dumped)`\n").name == "segfault"
    assert not read_log("**GPU 0: NVIDIA A100-SXM4-80GB**\n**torch 2.3.1**\n").failed


def test_a_shells_death_notice_is_read_in_the_users_language():
    # glibc's strsignal, translated: bash prints it in the user's locale
    assert read_log("epoch 3 loss 0.2\n已杀死\n").name == "oom_killed"
    assert read_log("./train.sh: Zeile 4: 81234 Getötet   python train.py\n").name == "oom_killed"
    assert read_log("epoch 3 loss 0.2\n段错误 (核心已转储)\n").name == "segfault"
    assert read_log("Erreur de segmentation (core dumped)\n").name == "segfault"


def test_a_list_of_possible_causes_is_not_a_cause():
    hint = ("(raylet) The worker died unexpectedly while running a task. Worker exit type: SYSTEM_ERROR. There are some "
            "potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage. (2) The "
            "worker crashed due to SIGSEGV.\n")
    assert read_log(hint).name is None
    peer = ("[rank3]:[E1102 10:00:01.000000000 ProcessGroupNCCL.cpp:542] [Rank 3] Collective WorkNCCL(SeqNum=7, "
            "OpType=BROADCAST, NumelIn=8, NumelOut=8, Timeout(ms)=600000) raised the following async exception: NCCL "
            "error: remote process exited or there was a network error, NCCL version 2.21.5\n")
    assert read_log(hint + peer).name == "peer_lost"
    # Ray's memory monitor says what it did
    said = "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
    assert read_log(said).name == "oom_killed"


def test_an_accelerators_out_of_memory_in_another_frameworks_words_is_cuda_oom():
    # PaddlePaddle's allocator says it in its own words, after an exception line or a glog WARNING
    paddle = ("ResourceExhaustedError:\n\nOut of memory error on GPU 0. Cannot allocate 129.394531MB memory on GPU 0, "
              "23.611938GB memory has been allocated and available memory is only 31.687500MB.\n\n"
              "Please check whether there is any other process using GPU 0.\n"
              " (at /paddle/paddle/fluid/memory/allocation/cuda_allocator.cc:95)\n")
    assert read_log(paddle).name == "cuda_oom"
    # ... but the host's memory is not the GPU's
    host = "OSError: [Errno 12] Cannot allocate memory\n"
    assert read_log(host).name == "host_oom"
    assert read_log("Out of memory error on CPU. Cannot allocate 2.0GB memory on CPU\n").name != "cuda_oom"


def test_rays_memory_monitor_killing_workers_is_the_oom_killer():
    raylet = ("(raylet) [2024-08-25 19:21:02,241 E 1111013 1111013] (raylet) node_manager.cc:3064: 12 Workers (tasks / "
              "actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: b8aad7ac, "
              "IP: 172.31.105.218) over the last time period.\n")
    assert read_log(raylet).name == "oom_killed"
    # its advice on how to avoid it is no kill
    advice = ("(raylet) Refer to the documentation on how to address the out of memory issue: https://docs.ray.io/en/latest/"
              "ray-core/scheduling/ray-oom-prevention.html. Consider provisioning more memory on this node.\n")
    assert read_log(advice).name is None


def test_a_guess_between_causes_is_not_a_cause():
    # joblib names two causes it cannot tell apart: neither is said to have happened
    guess = ("joblib.externals.loky.process_executor.TerminatedWorkerError: A worker process managed by the executor was "
             "unexpectedly terminated. This could be caused by a segmentation fault while calling the function or by an "
             "excessive memory usage causing the Operating System to kill the worker.\n")
    assert read_log(guess).kind == "unknown"
    # ... what it reports after the guess still decides
    assert read_log(guess + "\nThe exit codes of the workers are {SIGKILL(-9)}\n").name == "oom_killed"
    # one cause named, with what happened, is read
    one = "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n"
    assert read_log(one).name == "shm_full"
    # ... and a scheduler's other limit is not memory
    assert read_log("=>> PBS: job killed: walltime 3610 exceeded limit 3600\n").name == "job_terminated"


def test_a_cuda_debuggers_report_of_a_bad_address_is_an_illegal_memory_access():
    gdb = ("CUDA Exception: Warp Illegal Address\nThe exception was triggered at PC 0x7fffd3a1c2f0\n\n"
           'Thread 1 "python" received signal CUDA_EXCEPTION_14, Warp Illegal Address.\n')
    assert read_log(gdb).name == "cuda_illegal_memory_access"
    sanitizer = ("========= COMPUTE-SANITIZER\n========= Invalid __global__ write of size 4 bytes\n"
                 "=========     at 0x1b0 in scatter_kernel(float *, const long *, int)\n")
    assert read_log(sanitizer).name == "cuda_illegal_memory_access"


def test_a_gpu_the_driver_cannot_bring_up_is_lost_unless_more_is_said():
    init = ("[   14.220101] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0xffff:1290)\n"
            "[   14.220150] NVRM: GPU 0000:3b:00.0: rm_init_adapter failed, device minor number 2\n")
    assert read_log(init).name == "gpu_lost"
    ecc = "[   13.900010] NVRM: Xid (PCI:0000:3b:00): 48, pid=1890, An uncorrectable double bit error (DBE) has been detected\n"
    assert read_log(init + ecc).name == "gpu_ecc"


def test_a_jobs_own_handler_of_its_schedulers_signal_is_a_termination():
    lines = ("trainer INFO (2024-03-01 10:00:00,100) - Job has not timed out. Ran 42 minutes out of requested 240 minutes.\n"
             "trainer WARNING (2024-03-01 10:00:00,101) - Caught signal SIGUSR1 on node17: this job is preempted.\n")
    # the WARNING line after a long INFO line is a line of its own, not the INFO line's rest
    assert read_log(lines).name == "job_terminated"
    assert read_log("[rank: 0] Received SIGTERM: 15\nBypassing SIGTERM: 15\n").name == "job_terminated"


def test_a_peer_closing_the_connection_is_the_network_only_on_nccls_own_line():
    warn = "node2:511:602 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer node1<41220>\n"
    assert read_log(warn).name == "nccl_network"
    # given as the reason of a collective's error, the peer went away
    reason = ("[rank1]:[E1102 10:00:01.000 ProcessGroupNCCL.cpp:552] [Rank 1] Collective WorkNCCL(SeqNum=90, "
              "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) raised the following async exception: NCCL "
              "error: unhandled system error\nncclSystemError: System call (e.g. socket, malloc) failed.\nLast error:\n"
              "Net : Connection closed by remote peer node1<41220>\n")
    assert read_log(reason).name == "peer_lost"


def test_a_loggers_prefix_on_a_records_first_line_covers_the_record():
    # c10's logger puts "[rank1]:" on the first line of a message only: NCCL's explanation under it is rank 1's
    text = ("[rank1]:[E1102 10:00:01.000 ProcessGroupNCCL.cpp:552] [Rank 1] NCCL error in: ProcessGroupNCCL.cpp:1970, "
            "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.21.5\n"
            "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n"
            "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000\n")
    reading = read_log(text)
    assert reading.name == "duplicate_gpu" and reading.rank == 1


def test_nccls_explanation_with_a_ranks_label_belongs_to_the_unlabelled_error_above():
    # srun --label prefixes every line; a paste that cut the first line's label leaves the explanation labelled
    text = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
            "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.21.5\n"
            "3: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n3: Last error:\n"
            "3: Duplicate GPU detected : rank 3 and rank 0 both on CUDA device 3000\n")
    assert read_log(text).name == "duplicate_gpu"
    assert read_log(text.replace("\n", "\n\n")).name == "duplicate_gpu"  # a paste that double-spaces its lines
    # ... but not once that rank has printed an error of its own: then the explanation is its own error's
    own = ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, invalid usage, NCCL version 2.21.5\n"
           "3: Traceback (most recent call last):\n"
           "3: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n3: Last error:\n"
           "3: Duplicate GPU detected : rank 3 and rank 0 both on CUDA device 3000\n")
    reading = read_log(own)
    assert reading.name == "nccl_invalid_usage" and reading.line.startswith("torch.distributed.DistBackendError")


def cpp_stack(*symbols: str) -> str:
    return "".join(f"frame #{k}: {s} + 0x{40 + k:x} (0x7f00{k:08x} in /opt/venv/lib/python3.11/site-packages/torch/lib/"
                   f"libtorch_cuda.so)\n" for k, s in enumerate(symbols))


def test_a_cpp_stack_is_read_by_the_function_that_raised():
    stack = cpp_stack("c10::Error::Error(c10::SourceLocation, std::string)",
                      "c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::milliseconds>)",
                      "c10d::ProcessGroupNCCL::watchdogHandler()", "<unknown function>")
    assert read_log(stack).name == "collective_timeout"
    # ... only when nothing says more
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1890, GPU has fallen off the bus.\n"
    assert read_log(stack + xid).name == "gpu_lost"
    # a function that merely called the one that raised does not count
    called = cpp_stack("c10::Error::Error(c10::SourceLocation, std::string)", "c10d::ProcessGroupNCCL::abort()",
                       "c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::milliseconds>)")
    assert read_log(called).name is None
    alloc = cpp_stack("c10::Error::Error(c10::SourceLocation, std::string)", "c10::detail::torchCheckFail(char const*)",
                      "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, "
                      "CUstream_st*)", "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**)")
    assert read_log(alloc).name == "cuda_oom"


def test_nccl_retrying_a_connection_is_the_network_only_when_it_never_got_past_it():
    retry = "".join(f"node3:7001:7050 [0] NCCL INFO socketPollConnect: connect returned Connection timed out, retrying "
                    f"({k}/34) after sleep for {k}00 msec\n" for k in range(1, 4))
    assert read_log(retry).name == "nccl_network"
    connected = retry + "node3:7001:7050 [0] NCCL INFO Connected all rings\nnode3:7001:7050 [0] NCCL INFO Init COMPLETE\n"
    assert not read_log(connected).failed
    # another process still retrying is its own
    other = connected + "node4:8100:8120 [1] NCCL INFO Call to connect returned Connection refused, retrying\n"
    assert read_log(other).name == "nccl_network"


def test_nccls_return_code_trace_is_the_network_when_its_errno_is_a_sockets():
    trace = ("g105:26921:27058 [0] NCCL INFO misc/socket.cc:505 -> 2 (Operation now in progress)\n"
             "g105:26921:27058 [0] NCCL INFO misc/socket.cc:570 -> 2\n"
             "g105:26921:27058 [0] NCCL INFO bootstrap.cc:275 -> 2\n"
             "g105:26921:27058 [0] NCCL INFO init.cc:1493 -> 2\n"
             "g105:26921:27058 [0] NCCL INFO group.cc:64 -> 2 [Async thread]\n")
    assert read_log(trace).name == "nccl_network"
    assert read_log(trace.replace("Operation now in progress", "Connection refused")).name == "nccl_network"
    # no errno, or one no socket sets: only a system error
    assert read_log(trace.replace(" (Operation now in progress)", "")).name == "nccl_system_error"
    assert read_log(trace.replace("Operation now in progress", "Cannot allocate memory")).name == "nccl_system_error"


def test_nccls_own_warn_line_of_a_socket_reset_is_the_network_in_either_prefix():
    # older NCCL releases print the file and line with a space ("include/socket.h 398")
    old = ("worker0:15:91 [3] include/socket.h 398 NCCL WARN Call to write failed : Connection reset by peer.\n"
           "worker0:15:91 [3] transport.cu:153 NCCL WARN transport.cu:153 ->2 [Proxy thread error]\n")
    assert read_log(old).name == "nccl_network"
    new = old.replace("include/socket.h 398", "misc/socket.cc:398")
    assert read_log(new).name == "nccl_network"
    # a broken pipe on NCCL's line is a peer that went away; an INFO line still never decides
    assert read_log(old.replace("Connection reset by peer", "Broken pipe")).name == "peer_lost"
    assert not read_log(old.replace("NCCL WARN", "NCCL INFO")).failed


def test_waiting_in_the_store_based_barrier_is_a_rendezvous_timeout_only_when_it_never_got_past_it():
    wait = ("Waiting in store based barrier to initialize process group for rank: 0, key: store_based_barrier_key:1 "
            "(world_size=4, worker_count=8, timeout=0:30:00)\n")
    assert read_log("Added key: store_based_barrier_key:1 to store for rank: 0\n" + wait * 3).name == "rendezvous_timeout"
    # ... with the logger's INFO prefix, and the traceback it was interrupted in
    info = "INFO:torch.distributed.distributed_c10d:" + wait
    cut = tb("/home/u/train.py:494:main", "/opt/venv/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py:"
             "627:init_process_group", error="").rstrip("\n")
    assert read_log(info * 2 + cut).name == "rendezvous_timeout"
    # ... in a Markdown fence, double-spaced
    assert read_log("```\n" + (info * 2 + cut).replace("\n", "\n\n") + "\n```\n").name == "rendezvous_timeout"
    # the barrier completed, or the run went on: nothing failed
    done = wait * 2 + "Rank 0: Completed store-based barrier for key:store_based_barrier_key:1 with 4 nodes.\n"
    assert not read_log(done).failed
    assert not read_log(wait + "epoch 0 step 10 loss 2.31\n").failed
    # ... another rank's step after it: that rank waited a while and joined
    assert not read_log("[rank1]: " + wait + "[rank0]: epoch 0 step 10 loss 2.31\n").failed
    # an error that says more decides
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)\n"
    assert read_log(wait * 2 + oom).name == "cuda_oom"


def test_a_paste_indented_or_quoted_as_a_whole_is_read_as_its_lines():
    # a terminal's wrap is found by the lines' own indentation, not the code block's or the quote's
    said = ("[rank6]:[F ProcessGroupNCCL.cpp:1169] [PG 0 Rank 6] ProcessGroupNCCL's watchdog got stuck for 600 seconds "
            "without making progress in monitoring enqueued collectives. This typically indicates a NCCL/CUDA API hang "
            "blocking the watchdog, and could be triggered by another thread holding the GIL inside a CUDA api, or other "
            "deadlock-prone behaviors. If you suspect the watchdog is not actually stuck and a longer timeout would help, "
            "you can increase the timeout (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC). workMetaList_.size() = 42")
    wrapped = "".join(said[k: k + 100] + "\n" for k in range(0, len(said), 100)) + "srun: error: node17: task 6: Aborted\n"
    assert read_log(wrapped).name == "nccl_heartbeat"
    for lead in ("    ", "> "):
        assert read_log("".join(lead + x + "\n" for x in wrapped.splitlines())).name == "nccl_heartbeat", lead
    # a traceback's own indentation is kept: its code lines decide nothing
    code = tb("/home/u/train.py:12:main", error="KeyError: 'label'").replace("    pass", "    raise OSError('No space left on device')")
    reading = read_log("".join("    " + x + "\n" for x in code.splitlines()))
    assert reading.kind == "user_code" and reading.exception == "KeyError"


def test_a_connection_the_peer_closed_is_the_network_only_when_nothing_says_why_the_peer_went():
    for said in ("socketProgress: Connection closed by remote peer node2<51234>", "Call to recv failed : Connection reset by peer"):
        warn = f"node1:1234:1300 [0] misc/socket.cc:49 NCCL WARN {said}\n"
        assert read_log(warn).name == "nccl_network", said
        # the peer was killed, or raised: that is why its end of the connection went
        killed = warn + ("E0101 10:00:01.000 torch/distributed/elastic/multiprocessing/api.py:826] failed (exitcode: -9) "
                         "local_rank: 1 (pid: 1236) of binary: /usr/bin/python3\n")
        assert read_log(killed).name == "oom_killed", said
        oom = warn + "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        assert read_log(oom).name == "cuda_oom", said
    # an unreachable peer is the network whatever else the log says
    route = "node1:1234:1300 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<35457> failed : No route to host\n"
    assert read_log(route + "E0101 10:00:01.000 api.py:826] failed (exitcode: -9) local_rank: 1 (pid: 1236)\n").name == "nccl_network"


def test_a_command_typed_at_a_prompt_is_the_users_words_not_the_jobs():
    xid = ("[3629619.021460] NVRM: Xid (PCI:0000:00:0e): 31, pid=810735, name=python, channel 0x0000000d, intr 00000000. "
           "MMU Fault: ENGINE GRAPHICS GPC1 GPCCLIENT_T1_3 faulted @ 0x7f74_e9d5f000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ\n")
    for prompt in ('# dmesg | grep -iE "xid|nvidia|fallen off the bus" | tail -30', "$ dmesg | grep -i 'fallen off the bus\\|xid'",
                   "root@node1:~# dmesg | grep -e 'GPU has fallen off the bus' -e Xid"):
        assert read_log(prompt + "\n" + xid).name == "gpu_xid", prompt
    # what the command printed is the job's: the kernel's own line decides
    fell = "[3629620.000001] NVRM: GPU at PCI:0000:00:0e: GPU has fallen off the bus.\n"
    assert read_log('# dmesg | grep -iE "xid|fallen off the bus"\n' + xid + fell).name == "gpu_lost"
    assert read_log("$ python train.py\nSegmentation fault (core dumped)\n").name == "segfault"


def test_nccls_prefix_with_the_host_alone_is_nccls():
    warn = ("2025-11-24T03:20:21.001125857Z [2025-11-24 11:20:21] gpu-server320 [5] misc/socket.cc:46 NCCL WARN socketProgressOpt: "
            "Call to send to 10.0.0.2<52905> failed : Connection reset by peer\n"
            "2025-11-24T03:20:21.001128133Z gpu-server320 [5] NCCL INFO misc/socket.cc:64 -> 6\n")
    assert read_log(warn).name == "nccl_network"
    # its INFO line never decides
    info = "gpu-server320 [5] NCCL INFO misc/socket.cc:46 Call to send failed : Connection reset by peer\n"
    assert read_log(info).name != "nccl_network"


def test_a_cuda_error_torch_only_warns_about_is_still_the_cuda_error():
    end = "terminate called after throwing an instance of 'c10::CUDAError'\n"
    said = "Warning: CUDA warning: an illegal memory access was encountered (function destroyEvent)\n"
    assert read_log(said + end).name == "cuda_illegal_memory_access"
    assert read_log("[W CUDAGuardImpl.h:115] " + said + end).name == "cuda_illegal_memory_access"  # c10's glog prefix
    # another CUDA warning names no class; a bare "Warning:" line is still a warning, read as one
    assert read_log("Warning: CUDA warning: driver shutting down (function destroyEvent)\n" + end).name is None
    assert read_log("Warning: No space left on device for the cache, caching disabled\n").name is None


def test_the_flight_recorders_analysis_of_a_mismatch_is_a_collective_mismatch():
    head = ("Collective 39 at entry 38 errors\ngroup info: 0:default_pg\ncollective: nccl:all_reduce\n"
            "input sizes: [[1025]]\noutput sizes: [[1025]]\nworld size: 8\ncollective state: scheduled\n")
    for kind in ("SIZE_OR_SYNTAX_MISMATCH", "COLLECTIVE_TYPE_MISMATCH", "COLLECTIVE_DTYPE_MISMATCH"):
        text = head + f"error msg: Culprit rank 2; Error type: {kind}, Expected input sizes: '[[1025]]' does not match found input sizes: '[[262144]]'\n"
        assert read_log(text).name == "collective_mismatch", kind
    assert read_log(head).name is None
    # one rank finished the collective, another only scheduled it: a rank that did not arrive
    state = head + "error msg: Culprit rank 2; Error type: COLLECTIVE_STATE_MISMATCH, Expected state: 'scheduled' does not match found state: 'completed'\n"
    assert read_log(state).name != "collective_mismatch"


def test_open_mpis_peer_disconnected_box_is_a_peer_lost():
    box = ("--------------------------------------------------------------------------\n"
           "An MPI communication peer process has unexpectedly disconnected.  This\n"
           "usually indicates a failure in the peer process (e.g., a crash or\n"
           "otherwise exiting without calling MPI_FINALIZE first).\n\n"
           "  Local host: node1\n  Local PID:  12629\n  Peer host:  node2\n"
           "--------------------------------------------------------------------------\n")
    assert read_log(box).name == "peer_lost"
    # the peer's own end says why it went
    assert read_log("[node2:04321] *** Process received signal ***\n[node2:04321] Signal: Segmentation fault (11)\n"
                    + box).name == "segfault"


SPAWN_EXIT = ("W1127 14:10:38.752000 31529 site-packages/torch/multiprocessing/spawn.py:165] Terminating process 31640 "
              "via signal SIGTERM\n"
              + tb("/home/me/train.py:120:<module>", "/usr/lib/python3.11/site-packages/torch/multiprocessing/spawn.py:192:join",
                   error="torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with exit code {code}"))


def test_a_spawned_process_that_exited_by_itself_without_a_word_is_a_peer_lost():
    got = read_log(SPAWN_EXIT.format(code=1))
    assert got.name == "peer_lost" and got.line.endswith("process 1 terminated with exit code 1")
    # 128 + a signal is the signal's class, and an exit code of 0 is no process gone
    assert read_log(SPAWN_EXIT.format(code=143)).name == "job_terminated"
    assert read_log(SPAWN_EXIT.format(code=0)).name is None


def test_a_spawned_process_that_said_why_it_went_is_read_by_what_it_said():
    # how the group ended is the weakest sign: the process's own error, printed before, decides
    own = tb("/home/me/train.py:88:evaluate", error="ValueError: no validation data for rank 1") + SPAWN_EXIT.format(code=1)
    got = read_log(own)
    assert got.kind == "user_code" and got.exception == "ValueError"
    full = "OSError: [Errno 28] No space left on device: '/ckpt/step_3.pt'\n" + SPAWN_EXIT.format(code=1)
    assert read_log(full).name == "disk_full"


def test_a_failed_system_call_on_nccls_warn_line_is_nccls_system_error():
    warn = ("g148:14937:69361 [0] misc/shmutils.cc:93 NCCL WARN Call to open failed: No such file or directory\n"
            "g148:14937:69361 [0] misc/shmutils.cc:129 NCCL WARN Error while attaching to shared memory segment "
            "/dev/shm/nccl-glnlGK (size 14156128), error: No such file or directory (2)\n")
    assert read_log(warn).name == "nccl_system_error"
    # a file the job needs is missing; NCCL's shared memory that is full is shm_full
    assert read_log(tb("/home/u/train.py:12:main", error="FileNotFoundError: [Errno 2] No such file or directory: 'data/train.csv'")).name == "file_missing"
    full = ("g148:14937:69361 [0] misc/shmutils.cc:60 NCCL WARN Error: failed to extend /dev/shm/nccl-03v824 to 9637892 bytes, "
            "error: No space left on device (28)\n")
    assert read_log(full).name == "shm_full"


def test_nccl_failing_to_register_memory_is_a_system_error_not_the_network():
    for call in ("ibv_reg_mr_iova2", "ibv_reg_mr", "ibv_reg_dmabuf_mr"):
        warn = f"node1:1458548:1480527 [0] misc/ibvwrap.cc:182 NCCL WARN Call to {call} failed with error Invalid argument\n"
        assert read_log(warn).name == "nccl_system_error", call
    qp = "node1:1458548:1480527 [0] misc/ibvwrap.cc:295 NCCL WARN Call to ibv_modify_qp failed with error Connection timed out\n"
    assert read_log(qp).name == "nccl_network"


def test_a_local_path_transformers_cannot_load_from_is_a_missing_file():
    for said in ("OSError: Can't load config for '/data/models/roberta-large'. Make sure that:",
                 "OSError: Can't load tokenizer for './checkpoints/run1'. If you were trying to load it from 'https://huggingface.co/models'",
                 "OSError: Incorrect path_or_model_id: '/mnt/ckpt/llama-7b'. Please provide either the path to a local folder or the repo_id of a model on the Hub.",
                 "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/mnt/ckpt/llama-7b'. Use `repo_type` argument if needed."):
        text = tb("/home/u/run.py:237:main", "/opt/venv/lib/python3.11/site-packages/transformers/configuration_utils.py:362:get_config_dict", error=said)
        assert read_log(text).name == "file_missing", said
    # a Hub id that would not load is not a missing file
    hub = tb("/home/u/run.py:237:main", "/opt/venv/lib/python3.11/site-packages/transformers/configuration_utils.py:362:get_config_dict",
             error="OSError: Can't load config for 'roberta-large-uncased'. Make sure that:")
    assert read_log(hub).name != "file_missing"


def test_no_space_for_a_semaphore_or_a_memory_file_system_is_shared_memory():
    joblib = ("/venv/lib/python3.8/site-packages/joblib/_multiprocessing_helpers.py:46: UserWarning: [Errno 28] No space left on device.  "
              "joblib will operate in serial mode\n  warnings.warn('%s.  joblib will operate in serial mode' % (e,))\n")
    assert read_log(joblib).name == "shm_full"
    # another warning of a full disk is a warning
    assert read_log("/venv/lib/python3.8/site-packages/x/cache.py:46: UserWarning: [Errno 28] No space left on device\n").name is None
    err = "OSError: [Errno 28] No space left on device"
    assert read_log(tb("/w/train.py:111:main", "/venv/lib/python3.9/site-packages/pandarallel/core.py:263:closure", error=err)).name == "shm_full"
    assert read_log(tb("/w/train.py:111:main", "/venv/lib/python3.9/site-packages/pandas/io/parquet.py:263:write", error=err)).name == "disk_full"


def test_ncclS_invalid_argument_code_is_read_as_invalid_usage():
    trace = ("[1,1]<stdout>:node1:126624:126758 [1] misc/argcheck.cc:39 NCCL WARN Broadcast : invalid root 0 (root should be in the 0..-1 range)\n"
             "[1,1]<stdout>:node1:126624:126758 [1] NCCL INFO enqueue.cc:1450 -> {code}\n")
    assert read_log(trace.format(code=4)).name == "nccl_invalid_usage"
    assert read_log(trace.format(code=3)).name is None  # an internal error names no class


# -- what no class knows ----------------------------------------------------------------------------
def test_an_unknown_text_says_it_is_unknown():
    text = tb("/home/u/train.py:50:main", "/opt/venv/lib/python3.11/site-packages/torch/cuda/__init__.py:300:_lazy_init",
              error="RuntimeError: CUDA error: unspecified launch failure")
    reading = read_log(text)
    assert reading.kind == "unknown" and reading.cls is None and reading.failed
    assert reading.summary == "no known class: the last error was `RuntimeError: CUDA error: unspecified launch failure`, at __init__.py:300"
    assert read_log("ERROR: something nobody has seen before\n").summary.startswith("no known class: the last error was `ERROR:")


def test_the_programs_own_error_is_your_code_raised():
    text = tb("/home/u/train.py:57:main", "/home/u/model.py:12:forward",
              "/opt/venv/lib/python3.11/site-packages/torch/nn/functional.py:3053:cross_entropy",
              error="ValueError: Expected input batch_size (79) to match target batch_size (47).")
    reading = read_log(text)
    assert reading.kind == "user_code" and reading.cls is None
    assert reading.summary == "your code raised ValueError at model.py:12"
    assert "model.py:12" in reading.fix


def test_a_message_whose_exception_line_was_cut_is_that_exception():
    # load_state_dict's RuntimeError goes on over many lines; a paste may keep only those
    body = ("\tsize mismatch for head.fc.weight: copying a param with shape torch.Size([10, 512]) from checkpoint, the shape "
            "in current model is torch.Size([100, 512]).\n\tsize mismatch for head.fc.bias: copying a param with shape "
            "torch.Size([10]) from checkpoint, the shape in current model is torch.Size([100]).\n")
    reading = read_log(body)
    assert reading.kind == "user_code" and reading.exception == "RuntimeError"
    keys = read_log('\tMissing key(s) in state_dict: "encoder.layer.0.weight", "encoder.layer.0.bias".\n')
    assert keys.kind == "user_code" and keys.exception == "RuntimeError"
    # ... and with its exception line it is read as before
    whole = read_log("RuntimeError: Error(s) in loading state_dict for Net:\n" + body)
    assert whole.kind == "user_code" and whole.line.startswith("RuntimeError: Error(s)")


def test_misusing_distributed_data_parallel_is_the_programs_own_error():
    said = ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This "
            "error indicates that your module has parameters that were not used in producing loss.")
    reading = read_log(tb("/home/u/train.py:88:main", "/opt/venv/lib/python3.11/site-packages/torch/nn/parallel/"
                          "distributed.py:1139:forward", error=said))
    assert reading.kind == "user_code" and reading.exception == "RuntimeError"


def test_a_workers_error_whose_traceback_is_cut_is_the_one_its_wrapper_names():
    text = tb("/home/u/train.py:270:train", "/opt/venv/lib/python3.11/site-packages/torch/_utils.py:394:reraise",
              error="KeyError: Caught KeyError in DataLoader worker process 0.")
    text += ('Original Traceback (most recent call last):\n'
             '  File "/opt/venv/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py", line 178, in _worker_loop\n'
             '    data = fetcher.fetch(index)\n'
             '  File "/home/u/data/coco.py", line 91, in __getitem__\n'
             '    target = self.label_map[obj["category_id"]]\n')
    reading = read_log(text)
    assert reading.kind == "user_code" and reading.exception == "KeyError" and reading.site == "coco.py:91"


SERIALIZATION = "/opt/venv/lib/python3.11/site-packages/torch/serialization.py"


def test_a_cut_traceback_is_read_by_the_raise_it_stopped_at():
    frames = ["/home/u/pretrain.py:77:get_model", f"{SERIALIZATION}:613:_load", f"{SERIALIZATION}:115:validate_cuda_device"]
    text = tb(*frames, error="").replace("    pass\n\n", "    raise RuntimeError('Attempting to deserialize object on a CUDA '\n")
    reading = read_log(text)
    assert reading.name == "checkpoint_cuda_on_cpu" and reading.line.startswith("raise RuntimeError(")
    own = tb("/home/u/train.py:12:main", "/home/u/data.py:40:load", error="").replace(
        "    pass\n\n", "    raise ValueError(f'bad split {name}: '\n")
    said = read_log(own)
    assert said.kind == "user_code" and said.exception == "ValueError" and said.site == "data.py:40"


def test_a_cut_traceback_is_read_by_where_it_stopped_only_when_nothing_says_more():
    cut = tb("/home/u/fishing.py:143:main", f"{SERIALIZATION}:853:_load",
             f"{SERIALIZATION}:175:default_restore_location", error="").rstrip("\n")
    assert read_log(cut).name == "checkpoint_cuda_on_cpu"
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)\n"
    assert read_log(cut + "\n" + oom).name == "cuda_oom"
    elsewhere = tb("/home/u/train.py:143:main", "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py:1511:_call_impl",
                   error="").rstrip("\n")
    assert read_log(elsewhere).kind == "unknown"


def test_a_frame_line_a_paste_wrapped_inside_its_path_is_one_frame():
    cut = ('Traceback (most recent call last):\n  File "main.py", line 113, in main\n    model = build()\n'
           '  File "/home/u/anaconda3/envs/x/lib/python3.6/site-packages/torch\n    /serialization.py", line 368, in load\n'
           '    return _load(f, map_location, pickle_module)\n'
           '  File "/home/u/anaconda3/envs/x/lib/python3.6/site-packages/torch\n  /serialization.py", line 114, in '
           'default_restore_location\n')
    reading = read_log(cut)
    assert reading.name == "checkpoint_cuda_on_cpu" and reading.site == "main.py:113"
    # the joined frame's code is still code: its words decide nothing
    code = cut.replace("    return _load(f, map_location, pickle_module)", "    raise OSError('No space left on device')")
    assert read_log(code + "KeyError: 'state_dict'\n").kind == "user_code"
    # ... under a rank's label, or double-spaced
    labelled = "".join(f"[rank0]: {line}\n" for line in cut.splitlines())
    assert read_log(labelled).name == "checkpoint_cuda_on_cpu"
    assert read_log(cut.replace("\n", "\n\n")).name == "checkpoint_cuda_on_cpu"
    # a line with an open quote and no frame's rest after it is left as it is
    assert read_log('  File "/home/u/notes\nwere not found\n').kind == "none"


def test_the_end_of_the_cuda_on_cpu_message_is_that_message():
    # a paste that starts inside the message, or shows only its last source line
    tail = ("please use torch.load with map_location=torch.device('cpu') to map your storages to the CPU.\n")
    assert read_log("RuntimeError                              Traceback (most recent call last)\n" + tail).name == (
        "checkpoint_cuda_on_cpu")
    # a checkpoint saved on a GPU this machine does not have is not this class
    other = ("RuntimeError: Attempting to deserialize object on CUDA device 2 but torch.cuda.device_count() is 1. Please use "
             "torch.load with map_location to map your storages to an existing device.\n")
    assert read_log(other).name is None


def test_nothing_failed_says_so():
    reading = read_log("Epoch 1: 100%|██████████| 50/50 [00:05<00:00,  9.12it/s, loss=0.512]\n`Trainer.fit` stopped.\n")
    assert reading.kind == "none" and not reading.failed and reading.summary == "no failure in this log"


def test_every_class_says_what_who_where_and_the_fix():
    assert len(CLASSES) == 37 and len(BY_NAME) == 37  # the taxonomy's 32; 2 for NCCL's RAS report (issue 38); 3 reproduction showed missing (issue 42)
    for c in CLASSES:
        assert c.what and c.who and c.where and c.fix, c.name
        assert all(r in BY_NAME for r in c.refines), c.name


# -- ups why --log: input that is not a log ----------------------------------------------------------
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # never read from: opening it must not wait for a writer
    binary = tmp_path / "core"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8)
    for path, reason in ((tmp_path / "missing.log", "no such file"), (tmp_path, "a directory"), (fifo, "a FIFO"),
                         (binary, "binary data")):
        res = run_ups("why", "--log", str(path), timeout=30)
        assert res.returncode == 2 and reason in res.stderr, (path, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


@pytest.mark.parametrize("text, code", [("epoch 1 loss 0.4\n", 0), ("RuntimeError: CUDA error: out of memory\n", 1)])
def test_stdin_is_read_with_a_dash(text: str, code: int):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "ups", "why", "--log", "-", "--json"], input=text, capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == code, res.stderr


def test_the_logs_own_text_is_shown_as_text(tmp_path: Path):
    # A log line with a terminal escape and Rich markup: shown, never acted on or interpreted.
    log = tmp_path / "job.log"
    log.write_text("RuntimeError: CUDA error: out of memory [bold]\x1b]0;pwned\x07[/bold] \x1b[2J\n")
    res = run_ups("why", "--log", str(log), timeout=30)
    assert res.returncode == 1, res.stderr
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout
    assert "[bold]" in res.stdout and "cuda_oom" in res.stdout


def test_a_signs_words_are_in_every_line_it_matches():
    # The reader tries a sign only on lines holding one of the words every match of it holds
    # (ups.why.logread.words.required_words): a word wrongly taken as required would hide a
    # class. Every line of the dev corpus, and this file's texts, say it is not.
    import json

    from ups.why.logread.classes import SIGNS, may_show_a_class

    dev = Path(__file__).parent / "data" / "why_corpus" / "dev.jsonl"
    texts = [json.loads(line)["text"] for line in dev.read_text().splitlines() if line.strip()]
    texts.append(Path(__file__).read_text())
    for text in texts:
        for line in text.splitlines():
            lowered = line.lower()
            for sign in SIGNS:
                if sign.pattern.search(line):
                    assert sign.may_match(lowered) and may_show_a_class(lowered), (sign.cls, line)


def test_required_words_of_a_pattern():
    from ups.why.logread.words import required_words

    assert required_words(r"Watchdog caught collective operation timeout|WorkNCCL\([^)]*\) ran for \d+ ms") == (
        "watchdog caught collective operation timeout", ") ran for")
    assert required_words(r"spot (?:instance )?interruption") == ("interruption",)
    assert required_words(r"ab+c|x?yz") is None  # "ab" is only certain up to its "a"; "yz" is too short
