"""Import of Kiln's ``teachers.json``: the file (``registry``), entries (``entries``)."""
