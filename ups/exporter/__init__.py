"""Every run's figures for Prometheus: ``ups exporter`` and ``ups launch --metrics-port``.

:mod:`ups.exporter.families` turns one run as read by ``open_run`` (and ``ups why``'s verdict
on it) into metric families; :mod:`ups.exporter.collector` is prometheus_client's custom
collector that does that read at scrape time, for every live run of a runs folder or for one
run; :mod:`ups.exporter.server` serves it over HTTP, in the text format that
:mod:`ups.exporter.text` writes; :mod:`ups.exporter.address` reads ``[ADDRESS:]PORT``. Nothing polls between scrapes and
nothing is kept: each scrape reads the run folders as ``ups status`` would. The metric
names, their labels and the series count are documented in docs/monitoring.md.

prometheus_client is imported by these modules: import them only inside the commands
that serve (never on the path of ``ups --help``).
"""
