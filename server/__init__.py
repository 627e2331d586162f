"""Talkstream's HTTP and WebSocket adapters (FastAPI on uvicorn) and its command line."""
