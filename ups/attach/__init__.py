"""``ups attach``: a PyTorch job ups did not start, found from any of its processes, made a
run, and watched from outside (``/proc``, ``py-spy dump``, its log) by one observer process.

* :mod:`.find`: the job's process tree and each process's role, from ``/proc`` only;
* :mod:`.start`: the attached run's folder and its observer, started detached;
* :mod:`.observe`: the observer, the attached run's only writer (records, stacks, log copy,
  the end);
* :mod:`.pyspy`: stacks read from outside, written as the stack files ``ups why`` reads.

See docs/attach.md.
"""
