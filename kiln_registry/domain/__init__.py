"""The lowest layer: the error tree (``errors``), the alias rule (``aliases``) and the
registry's vocabulary of kinds and statuses (``vocabulary``).

Imports nothing of the project.
"""
