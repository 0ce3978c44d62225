"""The Redis transport: commands to servers and replies back, knowing nothing of Bloom filters."""
