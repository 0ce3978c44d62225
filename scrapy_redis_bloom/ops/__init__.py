"""Operations on whole filters, without opening them for a crawl: inspect, dump, restore."""
