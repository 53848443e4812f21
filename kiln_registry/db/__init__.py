"""The registry's SQLite database: rows, engine, Alembic upgrades and the repository.

``models`` (rows), ``engine`` (open_engine, upgrade_to_head, sessions) and
``repository`` (TeacherRepository, unit_of_work).  Import those modules
directly; this package runs nothing at import time.  Nothing under ``db``
imports the API, probe, launcher or jobs layers.
"""
