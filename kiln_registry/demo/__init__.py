"""``kiln demo``: the end-to-end run (``run``) and its child processes (``processes``)."""
