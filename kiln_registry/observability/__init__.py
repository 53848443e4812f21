"""Operator-facing observability: Prometheus metrics, JSON logs with request ids, progress.

``metrics`` (one ``CollectorRegistry`` per registry app), ``access`` (the pure
ASGI layer that counts, times and logs every request and sets its request id),
``logs`` (the JSON-lines formatter and ``kiln serve``'s logging set-up) and
``progress`` (tqdm bars on a TTY, nothing otherwise).  Nothing happens at
import time.
"""
