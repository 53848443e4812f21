"""Local teachers: vLLM process groups the registry launches from ``[teachers.local.<profile>]``.

``manager`` owns the running process groups (launch, readiness, stop, shutdown);
``service`` is the registry side (placeholder rows, probes, persistence,
relaunch, start-up reconciliation).  Importing this package imports neither.
"""
