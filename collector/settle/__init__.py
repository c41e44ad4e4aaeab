"""Settle: what a fetched page becomes.

``parse`` turns a body into records, ``validation`` runs the source's Great Expectations suite
(imported lazily, in the ``validation_worker`` child process) and splits good rows from bad;
beside it ``suite`` checks a suite file without GX, ``gx_runtime`` holds the GX objects,
``rowsplit`` the result types and the DataFrame, ``messages`` the one-line failure texts.
``outcomes`` decides each fetched item (dead, retry later, deferred, stored), ``records`` keys
and checks a batch's records, ``letters`` builds the run's dead letters. The order of writes
(sink before frontier ack, dead letters before the item is marked dead) is kept by
``collector.run.collection``, which calls these modules.
"""
