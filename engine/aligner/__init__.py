"""The forced aligner (Qwen3-ForcedAligner): each word of a transcript timed in its audio. It runs in a process of
its own (`process`), never on the Talker's thread."""
