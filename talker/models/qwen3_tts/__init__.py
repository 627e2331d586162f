"""Qwen3-TTS (12 Hz) Talker family: own implementation, official parameter names."""
