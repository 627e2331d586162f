"""The text front-end, on the event loop: a request's text → its Talker prompt(s). Validation, tokenization,
segmenting, language detection, normalisation, pauses, respellings and voices (`frontend.Frontend`)."""
