"""Voices from a reference recording: the codes and the speaker embedding that voice cloning prompts the Talker with."""
