"""ups instrumentation: Python imports this module at start-up in every process of a job that
``ups launch`` started (this folder is first on the job's PYTHONPATH, and only the job's).

It starts a status record for the process and installs post-import hooks that patch torch
if and when the program imports it (see ups/instrument/boot.py). It never breaks the
program: any failure is one line on stderr, and the program runs on uninstrumented. Then it
hands over to the ``sitecustomize`` that would have run without us, if there is one.
``UPS_INSTRUMENT=0`` turns it off.
"""

import os
import sys


def _ups_start() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get("UPS_INSTRUMENT", "1").lower() not in ("0", "false", "no", "off") and os.environ.get("UPS_RUN_DIR"):
        try:
            if "ups" not in sys.modules:
                # The ups that launched the job, from its own folder: the job's interpreter may
                # be another one (a venv without ups), and nothing else of ours' site-packages
                # may leak onto its path.
                import importlib.util

                pkg = os.path.dirname(os.path.dirname(here))
                spec = importlib.util.spec_from_file_location(
                    "ups", os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg]
                )
                module = importlib.util.module_from_spec(spec)
                sys.modules["ups"] = module
                spec.loader.exec_module(module)
            from ups.instrument.boot import boot

            boot()
        except Exception as exc:  # noqa: BLE001 - instrumentation must never stop the program
            try:
                print(f"ups: instrumentation off in this process ({type(exc).__name__}: {exc}); "
                      "the program runs on", file=sys.stderr, flush=True)
            except Exception:  # noqa: BLE001
                pass
    _chain(here)


def _chain(here: str) -> None:
    """Import the next ``sitecustomize`` on the path (the user's, the distribution's)."""
    ours = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401 - the next one, now that ours is off the path
    except ImportError as exc:
        if exc.name != "sitecustomize":
            print(f"ups: your sitecustomize failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.modules["sitecustomize"] = ours
    except Exception as exc:  # noqa: BLE001 - as site.py itself reports it
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.modules["sitecustomize"] = ours


_ups_start()
