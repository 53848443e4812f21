"""``kiln serve``: start-up (``startup``) and its uvicorn connection guards (``guard``)."""
