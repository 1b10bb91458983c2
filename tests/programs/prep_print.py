"""Convert files one by one, printing how far it got: the script with no progress bar.

    python prep_print.py [--files N] [--secs-per-file S]

Each "conversion" waits on something outside (here: sleeps), then a line
"converted k/n files" is printed.
"""

import argparse
import os
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=int(os.environ.get("PREP_FILES", "20")))
    parser.add_argument("--secs-per-file", type=float, default=float(os.environ.get("PREP_SECS", "1.5")))
    args = parser.parse_args()
    print(f"converting {args.files} files", flush=True)
    for k in range(1, args.files + 1):
        time.sleep(args.secs_per_file)
        print(f"converted {k}/{args.files} files", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
