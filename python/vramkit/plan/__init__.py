"""Planning memory: what a training step will need before it runs, and why one ran out.

Users ask ``estimator`` for a model's peak memory, whether it fits, the largest batch and
which activations to recompute, and ask ``doctor`` why an allocation failed (from the OOM
report, a snapshot or a trace, with ``_doctor_trace`` for traces) and which settings would
have fitted. ``_replaying`` runs a recorded trace through the engine in this process, which
both use to try a fix before the user does.
"""
