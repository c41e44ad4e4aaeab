"""Recovery: what happens after something went wrong.

``triage`` settles each open dead letter once (repair, re-validate, replay, re-enqueue,
escalate); ``repair`` holds the declared repair rules; ``audit`` re-checks written batches with
the suite's table-level expectations and compensates the ones that fail. The stores they work on
live in ``collector.deadletter``, ``collector.sinks`` and ``collector.frontier``.
"""
