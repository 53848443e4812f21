"""Teachers: the registry's operations on teacher aliases, below ``api/`` and ``jobs/``.

``kinds`` is the table of teacher kinds (one module each: ``remote``,
``local``, ``fixture``); ``probing`` is the one probing seam (resolve, probe,
verify, metrics, scrubbed receipt, a typed ``ProbeOutcome``); ``registration``
registers, re-probes, relaunches and deletes aliases by asking the alias's
kind; ``replicas`` proves one endpoint or a replica set and ``reprobe``
re-proves them; ``views`` and ``live_status`` are the read side (the stored
identity parsed once, the kind's live checks); ``local_registration`` and
``local_relaunch`` are the registry side of ``kind: local``; ``rows`` reads
and writes ``teachers`` rows; ``context`` holds the protocols the running
registry satisfies; ``host_rules`` is ``[server] teacher_hosts``.  Nothing
here imports ``kiln_registry.api``, Starlette or FastAPI (worker threads are
``asyncio.to_thread``); importing this package imports none of its modules.
"""
