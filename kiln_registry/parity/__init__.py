"""``kiln teachers parity``: the run against two teachers (``run``) and its grading (``grade``)."""
