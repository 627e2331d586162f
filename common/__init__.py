"""What every layer may import: the request and error vocabulary (`request`), child processes that die with the
server and their priorities (`children`), the native libraries built at install (`native`), and the portable random
numbers the tiny checkpoints and the codec's dither share (`portable_random`, the one that needs torch)."""
