"""Prefect flows and the `collector` command: thin orchestration over the `collector` engine."""
