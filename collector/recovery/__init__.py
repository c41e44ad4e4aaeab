"""Recovery: what happens after something went wrong.

``triage`` settles each open dead letter once (repair, re-validate, replay, re-enqueue,
escalate); ``repair`` holds the declared repair rules; ``audit`` re-checks written batches with
the suite's table-level expectations and compensates the ones that fail; ``compensation`` undoes
one batch, writing back only the replacement records that pass the suite (the others go to
review); ``review`` is a person's decision on an escalated entry. The stores they work on
live in ``collector.deadletter``, ``collector.sinks`` and ``collector.frontier``.
"""
