"""Operations: what lets people run Collector and trust it.

The backlog watermark (``backlog``), error reporting (``observability``: Sentry), Prometheus
metrics (``metrics``, ``metrics_server``) and OpenTelemetry traces (``tracing``), secret
scrubbing for everything written or logged (``scrub``), secret and block resolution
(``secrets``) and a source's fingerprint for change detection (``fingerprint``).
"""
