"""Local teachers: vLLM process groups the registry launches from ``[teachers.local.<profile>]``.

``process_groups`` owns the running process groups (``LocalTeachers``: launch,
readiness, stop, shutdown); ``launch_spec`` what one launch is made of (spec,
the launcher's protocols, profile flags, child environment); ``student`` the
generated profiles of Kiln-shape aliases (the loaded student plus an adapter).
The registry side (rows, probes, receipts, relaunch, start-up) is
``kiln_registry.teachers``.  Importing this package imports none of them.
"""
