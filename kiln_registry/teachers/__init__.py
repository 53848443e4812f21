"""Teachers: the registry's operations on teacher aliases, below ``api/`` and ``jobs/``.

``probing`` is the one probing seam (resolve, probe, verify, metrics, scrubbed
receipt, a typed ``ProbeOutcome``); ``registration`` registers, re-probes and
deletes aliases; ``local_registration`` and ``local_relaunch`` are the registry
side of ``kind: local``; ``rows`` reads and writes ``teachers`` rows; ``context``
holds the protocols the running registry satisfies; ``host_rules`` is
``[server] teacher_hosts``.  Nothing here imports ``kiln_registry.api`` or
FastAPI; importing this package imports none of its modules.
"""
