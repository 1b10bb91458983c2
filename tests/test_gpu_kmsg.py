"""Xids from the kernel log (ups.gpu.kmsg): the driver's own lines parsed, the real /dev/kmsg
read without harm, and a kernel-log Xid reaching the snapshot (the fake pynvml of
test_gpu_xid: this box has no GPU) and so the restart policy's hardware signs."""

from __future__ import annotations

import time
import types

from test_gpu_xid import fake_pynvml

from ups.gpu import kmsg
from ups.gpu.kmsg import KernelXidWatcher, parse_kmsg_record, parse_xid, pci_key

# The driver's words, as NVIDIA's Xid documentation and users' logs show them.
FELL_OFF = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
ECC = "NVRM: Xid (PCI:0000:B1:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0."
OLD = "NVRM: Xid (PCI:0000:02:00.0): 13, Graphics Exception: ESR 0x405840=0x80000000"


def test_the_drivers_xid_lines_are_read_with_their_gpu_address():
    x = parse_xid(FELL_OFF, at=5.0)
    assert (x.pci, x.xid, x.at) == ("0000:3b:00", 79, 5.0) and "fallen off the bus" in x.text
    assert parse_xid(ECC)[:2] == ("0000:b1:00", 48)
    assert parse_xid(OLD)[:2] == ("0000:02:00", 13)
    assert parse_xid("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54") is None
    assert parse_xid("usb 1-1: new high-speed USB device number 2") is None


def test_nvml_bus_ids_and_log_addresses_meet():
    assert pci_key("00000000:3B:00.0") == pci_key(b"00000000:3B:00.0") == pci_key("0000:3b:00") == "0000:3b:00"
    assert pci_key("not a bus id") is None and pci_key(None) is None


def test_a_kmsg_record_gives_its_time_since_boot():
    rec = b"3,8123,5000000,-;" + FELL_OFF.encode() + b"\n SUBSYSTEM=pci\n"
    x = parse_kmsg_record(rec, boot_wall=1000.0)
    assert x.xid == 79 and x.at == 1005.0
    assert parse_kmsg_record(b"6,1,2,-;eth0: link up", 0.0) is None
    assert parse_kmsg_record(b"garbage without a separator", 0.0) is None


def test_the_real_kernel_log_is_read_or_refused_in_one_line_never_raised():
    """This box's /dev/kmsg, only read: the first poll drains what the ring buffer holds, the
    next only what came since; where it cannot be read (no root, a container), a reason."""
    w = KernelXidWatcher()
    try:
        if w.reason is not None:
            assert "kernel log not readable" in w.reason and "\n" not in w.reason
            assert w.poll() == []
            return
        first = w.poll()
        assert all(isinstance(x.xid, int) for x in first)
        assert w.poll() == [] or all(x.at is None or x.at >= 0 for x in w.poll())
    finally:
        w.close()
    assert KernelXidWatcher("/nonexistent/kmsg").reason.startswith("kernel log not readable")


def test_a_kernel_log_xid_reaches_the_snapshot_and_the_hardware_signs(nvml_is):
    """The GPU at 0000:3b:00 fell off the bus before any NVML watcher opened: only the kernel
    log says so. The snapshot carries it on that device (by its PCI bus id), and the restart
    policy's hardware signs name that GPU."""
    from ups.gpu import NvmlProvider
    from ups.launch.onhang import hardware_signs

    m = fake_pynvml([], devices=2)
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=b"00000000:3B:00.0" if h[1] == 1 else b"00000000:18:00.0")
    nvml_is(m)
    watcher = KernelXidWatcher("/nonexistent/kmsg")
    watcher.events.append(parse_xid(FELL_OFF, at=time.time() - 60))  # a minute ago
    watcher.events.append(parse_xid(ECC.replace("B1:00", "18:00"), at=time.time() - 2 * 86400))  # two days ago: history
    kmsg.use_process_watcher(watcher)
    try:
        snap = NvmlProvider().snapshot()
    finally:
        kmsg.use_process_watcher(None)
    by_index = {d.index: d for d in snap.devices}
    assert by_index[1].pci_bus_id == "0000:3b:00" and by_index[1].xid_errors == (79,)
    assert by_index[0].pci_bus_id == "0000:18:00" and by_index[0].xid_errors == ()  # its Xid 48 is two days old
    signs = hardware_signs(snap)
    assert [s.gpu for s in signs] == [1] and "Xid 79" in signs[0].what
