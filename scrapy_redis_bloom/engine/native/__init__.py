"""The native backend: each shard a server-side Bloom filter (``BF.*``)."""
