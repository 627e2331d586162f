"""The Talker: the worker thread that owns the device (`worker`), its scheduler, the decode step (`runner`, eager;
`static_runner` and `compiled`, static shapes under `torch.compile`), the KV cache, the sampler and the Qwen3-TTS
model (`models/`). Only request ids and step snapshots leave it."""
