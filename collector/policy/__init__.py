"""Policy: the per-URL decisions a source declares, as pure functions of a URL and the clock.

Freshness and the four TTLs (``ttl``), the priority score with aging (``priority``), backoff,
attempt caps and the retry budget (``retry``), and which URLs may be fetched at all (``urls``).
Nothing here does I/O except the host policy's DNS check; every later stage asks these modules
instead of deciding for itself.
"""
