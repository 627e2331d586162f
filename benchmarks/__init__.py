"""Benchmarks that print figures (`talkstream bench NAME`, `python -m benchmarks NAME`, or `python -m
benchmarks.NAME`)."""
