"""The Qwen3-TTS model (`qwen3_tts/`) and how a checkpoint becomes it: Hub resolution (`hub`), loading (`loader`),
packed and int8 projections (`pack`, `quantize`)."""
