"""py-spy's dump, a format we do not control, read in one place (ups.runs.pyspy): the recorded
dumps of one program (tests/data/pyspy/program.py, recorded by scripts/record_pyspy.py) by each
py-spy release the ``attach`` extra allows read the same. py-spy 0.4.3 prints a frame's
qualified name (``Dataset.__getitem__``) where 0.4.1 and 0.3.14 printed ``__getitem__``: every
rule compares the function's own name, and the qualified one is shown where it is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ups.runs.pyspy import (
    as_faulthandler,
    function_name,
    loop_counters,
    sample_in_flight,
    trainer_position,
)
from ups.why import stacks

DATA = Path(__file__).parent / "data" / "pyspy"
MAIN = 4242  # the recorded main thread's id (scripts/record_pyspy.py): its id is the process's pid
VERSIONS = ["0.3.14", "0.4.1", "0.4.3"]
PROGRAM_LINES = {text.strip(): n for n, text in enumerate((DATA / "program.py").read_text().splitlines(), 1)}


def section(name: str) -> stacks.Section:
    threads = json.loads((DATA / name).read_text())
    text = as_faulthandler(threads, "rank 0", MAIN, "attach")
    found = stacks.latest(text)
    assert found is not None, text
    return found


@pytest.mark.parametrize("version", VERSIONS)
def test_every_release_reads_as_the_same_frames(version):
    s = section(f"dump-{version}.json")
    assert [f.function for f in s.stack] == ["__getitem__", "<listcomp>", "fetch", "<module>"]
    fetching = PROGRAM_LINES["return [ds[idx] for idx in possibly_batched_index][:1]"]
    assert [f.line for f in s.stack] == [PROGRAM_LINES["time.sleep(3600)  # idle: the main thread waits here"],
                                         fetching, fetching, PROGRAM_LINES["fetch([51])"]]
    assert s.own_frame is not None and s.own_frame.function == "__getitem__" and s.own_frame.site == "program.py:11"
    # the other thread: the active spinner, its nested function by its own name
    spinner = next(t for t in s.threads if t is not s.main)
    assert [f.function for f in spinner.frames][:2] == ["inner", "spin"]


def test_the_newest_release_shows_the_qualified_name_and_compares_the_function():
    new, old = section("dump-0.4.3.json"), section("dump-0.4.1.json")
    assert new.own_frame.qualname == "Dataset.__getitem__" and old.own_frame.qualname == ""
    assert new.own_frame == old.own_frame  # the same frame, whichever way it was printed
    assert str(new.own_frame) == "program.py:11 in Dataset.__getitem__"
    assert new.signature() == "Dataset.__getitem__ at program.py:11" and old.signature() == "__getitem__ at program.py:11"
    assert [f.qualname or f.function for f in new.stack][:2] == ["Dataset.__getitem__", "fetch.<locals>.<listcomp>"]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_index_in_flight_is_read_from_the_locals_of_every_release(version):
    threads = json.loads((DATA / f"dump-{version}.json").read_text())
    assert sample_in_flight(threads, MAIN) == "index 51"
    assert sample_in_flight(threads, 1) is None  # no thread of that id: nothing in flight


@pytest.mark.parametrize("version", ["0.4.1", "0.4.3"])
def test_native_frames_among_the_python_ones(version):
    """--native (0.3.14 cannot merge them on Python 3.11): C frames of libc and libpython
    around the Python ones; the program's own frame is still __getitem__."""
    s = section(f"dump-{version}.native.json")
    names = [f.function for f in s.stack]
    assert names[:2] == ["clock_nanosleep", "time_sleep"] and "<module>" in names
    assert s.own_frame is not None and s.own_frame.function == "__getitem__"


def test_the_recorded_json_has_every_field_ups_reads():
    """What a new release must keep: a list of threads, each with os_thread_id and frames; each
    frame with name, filename, line and (with --locals) its locals' name and repr."""
    for version in VERSIONS:
        threads = json.loads((DATA / f"dump-{version}.json").read_text())
        assert isinstance(threads, list) and all({"os_thread_id", "frames"} <= set(t) for t in threads), version
        frames = [f for t in threads for f in t["frames"]]
        assert all({"name", "filename", "line"} <= set(f) for f in frames), version
        assert any({"name", "repr"} <= set(v) for f in frames for v in f.get("locals") or []), version


@pytest.mark.parametrize(("printed", "own"), [
    ("Trainer._run_epoch", "_run_epoch"), ("_run_epoch", "_run_epoch"), ("outer.<locals>.inner", "inner"),
    ("<module>", "<module>"), ("A.<lambda>", "<lambda>"), ("_MultiProcessingDataLoaderIter._next_data", "_next_data"),
    ("", ""), (None, ""),
])
def test_a_frame_is_compared_by_its_own_function_name(printed, own):
    assert function_name(printed) == own


@pytest.mark.parametrize("version", VERSIONS)
def test_a_ranks_loop_counters_are_the_main_threads_integer_locals_in_every_release(version):
    """Two reads whose frames are alike but whose counters differ went round (ups.attach.observe):
    the main thread's plain integers only; another thread's counter (the spinner's ``n``) and an
    object's repr (which holds its address) are not counters."""
    threads = json.loads((DATA / f"dump-{version}.json").read_text())
    assert loop_counters(threads, MAIN) == (("__getitem__", "idx", 51), ("<listcomp>", "idx", 51))
    assert loop_counters(threads, 1) == ()
    moved = json.loads(json.dumps(threads).replace('"repr": "51"', '"repr": "52"'))
    assert loop_counters(moved, MAIN) != loop_counters(threads, MAIN)


@pytest.mark.parametrize(("name", "position"), [
    ("lightning-0.4.3.json", {"epoch": 6, "batch_idx": 18}),
    ("lightning-0.4.3-next.json", {"epoch": 7, "batch_idx": 8}),
    ("lightning-0.4.1.json", {"epoch": 8, "batch_idx": 1}),
    ("lightning-0.4.1-between-epochs.json", None),
])
def test_a_lightning_ranks_epoch_and_batch_are_read_from_its_optimizer_step_in_every_release(name, position):
    """Real dumps (``--json --nonblocking --locals``) of rank 0 of tests/programs/frameworks/lit.py
    run by `python lit.py --bar --steps 1000000 --step-time 0.02` (Lightning 2.6.6, max_steps set,
    so max_epochs -1 and no end in epochs): ``LightningModule.optimizer_step``'s arguments
    (0.4.3 prints the class, 0.4.1 not); a read between two epochs says nothing."""
    threads = json.loads((DATA / name).read_text())
    assert trainer_position(threads, MAIN) == position
    assert trainer_position(threads, 1) is None  # not its main thread
