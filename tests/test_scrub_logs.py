"""Known secrets never reach a log line: ours, Prefect's, tracebacks, the flow run's API logs."""

from __future__ import annotations

import io
import logging
import uuid

import pytest

from collector.ops.scrub import REDACTED, remember_secrets

SECRET = "hunter2-" + uuid.uuid4().hex[:12]


def test_every_handler_scrubs_message_args_and_traceback() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("collector.test.scrub_logs")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        remember_secrets([SECRET])  # attaches the filter to handlers configured now
        logger.warning("calling with %s in http://h/x?token=abc123", SECRET)
        try:
            raise RuntimeError(f"upstream refused key {SECRET}")
        except RuntimeError:
            logger.exception("failed")
        plain = logging.LogRecord("x", logging.INFO, __file__, 1, "nothing %s", ("here",), None)
        handler.handle(plain)
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert SECRET not in text and "abc123" not in text
    assert text.count(REDACTED) >= 3
    assert "RuntimeError: upstream refused key [redacted]" in text
    # a record without secrets is left exactly as it was
    assert plain.msg == "nothing %s" and plain.args == ("here",)


def test_prefect_failed_state_line_is_scrubbed_in_the_api_and_console(
    prefect_api: str, capfd: pytest.CaptureFixture[str]
) -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    @flow(name="leaky-flow")
    def leaky() -> None:
        remember_secrets([SECRET])  # as Collection does once a source is loaded
        raise RuntimeError(f"upstream refused key {SECRET}")

    flow_runs = logging.getLogger("prefect.flow_runs")
    level = flow_runs.level
    flow_runs.setLevel(logging.INFO)  # the suite runs Prefect at WARNING; the line is INFO
    try:
        state = leaky(return_state=True)
    finally:
        flow_runs.setLevel(level)
    assert state.is_failed()
    flow_run_id = state.state_details.flow_run_id
    APILogWorker.drain_all(timeout=10)  # logs reach the API in batches

    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
        )
    messages = "\n".join(log.message for log in logs)
    assert "Finished in state Failed" in messages
    assert SECRET not in messages and REDACTED in messages
    console = capfd.readouterr()
    assert SECRET not in console.out + console.err
