"""What ``ups attach --inject`` runs inside a process of the attached job (Python >= 3.14).

Not imported by ups: :mod:`ups.attach.inject` has the job's own interpreter call
``sys.remote_exec(pid, script)`` (PEP 768) with a one-line script that runs this file with
:func:`runpy.run_path` under the name ``__ups_inject__`` and ``UPS_INJECT`` (the run folder and
the identity the attached run found). The target's main thread runs it at its next eval-breaker
check, in a namespace of its own (a remote script otherwise runs in ``__main__``'s).

It does what ``ups launch``'s sitecustomize does at a job's start-up, now: ups is imported from
its own folder (the job's interpreter may have no ups installed), the run folder goes into the
process's environment (``UPS_RUN_DIR``: its children inherit it, as a launched job's do), and
:func:`ups.instrument.boot.boot_attached` installs the hooks and starts the in-process Reporter
(record, heartbeat thread, stack-dump handler). Any failure is one line on stderr; the program
runs on.
"""

import os
import sys


def _start(spec: dict) -> None:
    try:
        if "ups" not in sys.modules:
            import importlib.util

            pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            found = importlib.util.spec_from_file_location("ups", os.path.join(pkg, "__init__.py"),
                                                           submodule_search_locations=[pkg])
            sys.modules["ups"] = module = importlib.util.module_from_spec(found)
            found.loader.exec_module(module)
        os.environ.update(UPS_RUN_DIR=spec["run_dir"], UPS_RUN_ID=spec["run_id"], UPS_AUTOMATIC="observe")
        from ups.instrument.boot import boot_attached

        boot_attached(spec["role"], name=spec["name"], rank=spec.get("rank"), local_rank=spec.get("local_rank"),
                      world_size=spec.get("world_size"))
    except Exception as exc:  # noqa: BLE001 - what runs inside someone's program must never stop it
        try:
            print(f"ups attach --inject: no in-process reporter ({type(exc).__name__}: {exc}); the program runs on",
                  file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001
            pass


if __name__ == "__ups_inject__":
    _start(globals()["UPS_INJECT"])
