"""Run: one collect run of one source, from plan to account.

``collection`` holds the run's backends and its steps (plan, claim, fetch, settle, finish),
``ledger`` the accounts and the conservation check that proves every item ended once, and
``locks`` the names and slot plans of the cross-worker locks. Prefect flows call into here;
nothing here imports Prefect.
"""
