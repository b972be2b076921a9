"""OpenAI's protocol: the upload routes (transcriptions, translations, the seed's
subtitles and SSE), Realtime transcription sessions and their client secrets."""
