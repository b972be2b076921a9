"""faster-whisper: the engine, batched clips (`batch`), fast drafts (`draft`), languages,
prompts and logprobs (`extras`)."""
