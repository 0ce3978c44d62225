"""The Redis transport: commands to servers and replies back, knowing nothing of Bloom filters.

:mod:`.wire` packs commands (RESP) and names scripts; :mod:`.node` is one server's
connection, every reply matched to its command; :mod:`.topology` says which server
holds a key (one server, a list, a Redis Cluster); :mod:`.executor` is the one call
path every exchange goes through, with one classification of outcomes and one retry
policy; :mod:`.connection` and :mod:`.sentinel` build redis-py clients from settings.
"""
