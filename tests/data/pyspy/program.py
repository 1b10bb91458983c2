"""The program whose stacks tests/data/pyspy/ holds, as each py-spy version dumped it
(scripts/record_pyspy.py): a method, a module function, <module>, a nested function, a
Dataset's __getitem__ with its index, an idle main thread and an active one."""

import threading
import time


class Dataset:
    def __getitem__(self, idx):
        time.sleep(3600)  # idle: the main thread waits here
        return idx


def spin():
    def inner():
        n = 0
        while True:  # active: a thread that computes
            n += 1
    inner()


def fetch(possibly_batched_index):
    ds = Dataset()
    return [ds[idx] for idx in possibly_batched_index][:1]


threading.Thread(target=spin, name="spinner", daemon=True).start()
print("ready", flush=True)
fetch([51])
