"""Audio in and out: uploaded recordings decoded in sandboxed child processes, and the response formats' encoders
with speed and resampling (`transcode`)."""
