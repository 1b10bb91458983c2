"""Runs: a run's folder and files (rundir), the one way to read a run (read.open_run: its view,
settled in memory, never written), the outcome rules, the ``--json`` contract (payload),
other nodes' streams (remote), and the proofs and signals every action on a run goes through
(ownership, signals, actions).

Nothing is imported here: each reader loads the modules it uses (``ups --help`` stays fast).
"""
