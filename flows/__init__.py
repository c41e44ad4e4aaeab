"""Prefect flows and the `collector` command: thin orchestration over the `collector` engine.

Importing this package sets no environment variables: the `collector` command sets its quiet,
offline Prefect defaults as it starts (flows/cli/_common.py), the tests in tests/conftest.py.
A program that calls a flow from Python gets its own Prefect settings as they are (offline:
docs/prefect.md says which two to set).
"""
