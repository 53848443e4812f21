"""The browser pages: Swagger UI at ``/docs`` and the operator dashboard at ``/ui``.

Both pages are static shells served from this package (``static/``) and from
the ``fastapi-offline`` package (Swagger UI's own files): no CDN, nothing is
fetched from outside the registry.  The shells carry no data, so they are open
like ``/health``; every piece of data the page shows comes from the JSON API
with the operator's token (``Authorization: Bearer``, kept in the tab's
``sessionStorage``), under the API's own scope rules.  Every response carries
a strict Content-Security-Policy (scripts from this origin only, no inline
script, no ``eval``).  ``routes`` is the router; ``assets`` the file table.
"""
