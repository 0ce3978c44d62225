"""The pure core: settings, hashing, sizing, key layout, records and growth; no I/O.

These modules import nothing of the package but each other.
"""
