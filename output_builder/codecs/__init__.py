"""Codec decoders: audio-codec codes -> PCM waveforms."""

from output_builder.codecs.qwen12hz import Qwen12HzCodec
from output_builder.codecs.qwen12hz_config import CodecConfig
from output_builder.codecs.qwen12hz_decoder import Qwen12HzDecoder, init_audible_

__all__ = ["CodecConfig", "Qwen12HzCodec", "Qwen12HzDecoder", "init_audible_"]
