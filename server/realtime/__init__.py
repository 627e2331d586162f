"""The Realtime WebSocket (`/v1/realtime`): its route, protocol models, session, input buffers, responses and events."""
