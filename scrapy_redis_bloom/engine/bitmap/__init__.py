"""The bitmap backend: the filter's bits in Redis strings, set by Lua or by ``BITFIELD``."""
