"""Fetch: turning a leased batch of URLs into one result per URL.

``engine`` owns concurrency, per-host slots and rates, deadlines, the size cap, redirects with a
host check per hop, and the retry decision per attempt; ``transport`` chooses the connection pool
under httpx; ``ratelimit`` is the per-host rate limiter (in-process or shared through Redis).
A fetch never writes anything: outcomes are decided in ``collector.settle``.
"""
