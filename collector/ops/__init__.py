"""Operations: what lets people run Collector and trust it.

The backlog watermark (``backlog``), error reporting (``observability``: Sentry), secret
scrubbing for everything written or logged (``scrub``), secret and block resolution
(``secrets``) and a source's fingerprint for change detection (``fingerprint``).
"""
