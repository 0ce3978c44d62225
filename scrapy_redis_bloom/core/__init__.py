"""The pure core: settings, hashing, sizing, key layout, records and growth; no I/O.

Everything above builds on these modules, and they import nothing of the package but
each other.
"""
