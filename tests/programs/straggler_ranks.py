"""Two ranks that step together, rank 1 slower by its own work: the straggler the torch hooks
would show, without torch. Each rank is a process with its own Reporter (ups.status), driven
through the calls the hooks make (ups.instrument.torch): the DataLoader's next batch (enter and
leave phase ``data``), an all_reduce both ranks meet in (a multiprocessing barrier, inside
``enter_collective``/``leave_collective``), the optimizer step (``auto_step``). Rank 1's own
work takes SLOW_MS longer a step, so rank 0 waits that long in the all_reduce, every step.

    python straggler_ranks.py [SLOW_MS] [STEPS]     # defaults: 10 ms, forever

Sleeps, not work: the box's cores stay free for the test that reads the records.
"""

import multiprocessing as mp
import os
import sys
import time

from ups.status import Reporter

DATA_S = 0.002  # waiting for the next batch, each rank
OWN_S = 0.005  # forward, backward, optimizer: each rank's own work


def rank_main(rank: int, slow_s: float, steps: int, barrier) -> None:
    rep = Reporter(os.environ["UPS_RUN_DIR"], role="rank", rank=rank, local_rank=rank, world_size=2, unit="steps",
                   phase="train", interval=0.3).start()
    step = 0
    try:
        while steps <= 0 or step < steps:
            rep.enter("data")
            time.sleep(DATA_S)
            rep.leave("train")
            time.sleep(OWN_S + (slow_s if rank == 1 else 0.0))
            rep.enter_collective("all_reduce", "straggler_ranks.py:36", "collective:all_reduce")
            barrier.wait()
            rep.leave_collective("train")
            step += 1
            rep.auto_step(step)
    finally:
        rep.close()


def main() -> None:
    slow_s = float(sys.argv[1]) / 1e3 if len(sys.argv) > 1 else 0.010
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    ranks = [ctx.Process(target=rank_main, args=(r, slow_s, steps, barrier)) for r in (0, 1)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join()
    sys.exit(max(p.exitcode or 0 for p in ranks))


if __name__ == "__main__":
    main()
