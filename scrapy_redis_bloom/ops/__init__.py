"""Operations on whole filters, without opening them for a crawl: inspect, dump, restore.

:mod:`.inventory` reads a filter as it is in Redis; :mod:`.dump` writes it to a
stream in the format of :mod:`.dumpfile`; :mod:`.restore` loads a dump into any
topology, all or nothing; :mod:`.scanning` scans keys and sets, across server restarts.
"""
