"""Codec decoders: audio-codec codes -> PCM waveforms."""

from output_builder.codecs.qwen12hz import (
    ChunkJob,
    CodecConfig,
    Qwen12HzCodec,
    Qwen12HzDecoder,
    init_audible_,
)

__all__ = ["ChunkJob", "CodecConfig", "Qwen12HzCodec", "Qwen12HzDecoder", "init_audible_"]
