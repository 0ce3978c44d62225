"""The Redis transport: commands to servers and replies back, knowing nothing of Bloom filters.

:mod:`.executor` is the one call path every exchange goes through, with one
classification of outcomes and one retry policy.
"""
