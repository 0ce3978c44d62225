"""The pure core: settings, hashing, sizing, key layout, records and growth; no I/O.

Everything above builds on these modules, and they import nothing of the package
but each other: :mod:`.settings` (settings to a validated configuration),
:mod:`.hashing` (fingerprint to shard and bit offsets), :mod:`.sizing` (capacity and
error rate to a geometry), :mod:`.generations` (growth and re-crawl windows),
:mod:`.layout` (key names, shard headers), :mod:`.record` (the filter's stored
configuration), :mod:`.events` (what the filter reports as it runs), :mod:`.errors`,
:mod:`.redact` (passwords out of messages), :mod:`.versions` (library floors).
"""
