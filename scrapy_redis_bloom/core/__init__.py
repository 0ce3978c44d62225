"""The pure core: settings, hashing, sizing, key layout, records and growth; no I/O."""
