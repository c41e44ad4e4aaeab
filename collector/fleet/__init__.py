"""Many sources on one Prefect pool: what each source's deployment is, and how many helpers
each deployed source gets (the autoscaler's model).

Plain Python, no Prefect: :mod:`collector.fleet.schedule` is a source's ``schedule:`` section,
:mod:`collector.fleet.deploy` turns a source into the plan of its own deployment, and
:mod:`collector.fleet.model` decides helpers per source from samples (weights, load factor,
budget) as pure functions of their inputs, testable in virtual time. The Prefect side lives in
``flows/deploy.py`` (writing deployments) and ``flows/fleet.py`` (the autoscaler flow).
"""
