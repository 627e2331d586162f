"""Benchmarks that print figures (`talkstream bench NAME`, or `python -m benchmarks.NAME`)."""
