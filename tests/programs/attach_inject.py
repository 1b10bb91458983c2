"""A long-running script that knows nothing of ups (started with RANK=0 WORLD_SIZE=1, as one rank).

It prints a counter and sleeps in short naps, so its main thread reaches a bytecode boundary
several times a second (where ``sys.remote_exec`` runs a script). ``ATTACH_INJECT_RUN`` (this
test program's own switch, for interpreters without ``sys.remote_exec``) names a file: once it
exists, it holds a script path, run here in the main thread in ``__main__``'s namespace, as
``sys.remote_exec`` runs one. At the end it prints which globals of its own were added.
"""

import os
import time

trigger = os.environ.get("ATTACH_INJECT_RUN")
for step in range(int(os.environ.get("ATTACH_INJECT_STEPS", "1200"))):
    if trigger and os.path.exists(trigger):
        with open(trigger) as f:
            script = f.read().strip()
        os.unlink(trigger)
        with open(script) as f:
            code = compile(f.read(), script, "exec")
        before = set(globals()) | {"before"}
        exec(code, globals())  # what sys.remote_exec does: the script, in __main__'s namespace
        print(f"ran {script} new globals: {sorted(set(globals()) - before)}", flush=True)  # one write: the test reads the line
    if step % 10 == 0:
        print(f"step {step}", flush=True)
    time.sleep(0.1)
