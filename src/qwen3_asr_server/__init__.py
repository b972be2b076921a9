"""qwen3-asr-server: OpenAI-compatible speech-to-text for Qwen3-ASR. Importing it is light."""

__version__ = "0.1.0"
