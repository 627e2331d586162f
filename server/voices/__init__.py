"""Created voices: the routes (`/v1/audio/voices`, consents), the library on SQLite and its store, names, the CLI."""
