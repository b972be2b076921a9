"""Qwen3-ASR: the SDK loaded (`load`), the step path (`steps`, `rows`, `loop`), the SDK's
`generate` path (`generate`, `guard`), tokens and the aligner's word times; `engine` ties them."""
