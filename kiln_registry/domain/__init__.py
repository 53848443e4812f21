"""The lowest layer: the error tree (``errors``) and the alias rule (``aliases``).

Imports nothing of the project.
"""
