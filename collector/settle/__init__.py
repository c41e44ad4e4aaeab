"""Settle: what a fetched page becomes.

``parse`` turns a body into records, ``validation`` runs the source's Great Expectations suite
(imported lazily, in the ``validation_worker`` child process) and splits good rows from bad;
beside it ``suite`` checks a suite file without GX, ``gx_runtime`` holds the GX objects,
``rowsplit`` the result types and the DataFrame, ``messages`` the one-line failure texts.
The order of writes (sink before frontier ack, dead letters before the item is marked dead) is
kept by ``collector.run.collection``, which calls these modules.
"""
