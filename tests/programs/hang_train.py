"""A single-process training loop that stops making progress at --hang-step (stuck in its own
code, as a loop waiting on something that never comes). It knows nothing of ups.

    python hang_train.py --steps 200 --hang-step 5 [--hang-once FLAG_FILE]

With --hang-once, it hangs only while FLAG_FILE does not exist (and creates it): a transient
hang that a restart gets past. It resumes from its own checkpoint (--ckpt), as a real loop does.
"""

import argparse
import os
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--hang-step", type=int, default=5)
    p.add_argument("--hang-once")
    p.add_argument("--ckpt")
    p.add_argument("--step-time", type=float, default=0.02)
    args = p.parse_args()

    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if args.ckpt and os.path.exists(args.ckpt):
        state = torch.load(args.ckpt)
        model.load_state_dict(state["model"])
        start = state["step"]
    print(f"started at step {start} at {time.time():.3f}", flush=True)
    for step in range(start, args.steps):
        if step == args.hang_step and not (args.hang_once and os.path.exists(args.hang_once)):
            if args.hang_once:
                open(args.hang_once, "w").close()
            print(f"hanging at step {step}", flush=True)
            while True:
                time.sleep(0.5)
        x = torch.randn(16, 8)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.ckpt and step % 5 == 4:
            torch.save({"model": model.state_dict(), "step": step + 1}, args.ckpt)
        time.sleep(args.step_time)


if __name__ == "__main__":
    main()
