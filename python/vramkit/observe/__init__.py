"""Observing memory: what a running program, or every program on the machine, holds.

Users record and read what happened (``history``: memory history, snapshots and traces;
``leaks``: what a step left behind; ``logger``: one line of figures per training step;
``records``: the small files every vramkit process keeps for the others to read), watch
it live (``top``), and publish it (``export`` and its HTTP server ``_serve``: Prometheus
metrics of the whole machine; ``prometheus``: metrics of this process; ``distributed``:
figures gathered over the ranks of a job). ``_nvml`` is the driver's view they add.
"""
