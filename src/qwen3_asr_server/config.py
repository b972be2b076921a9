"""Every setting of the server, read from the environment or `.env`, in one class.

Nothing else in the package reads `os.environ`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_CPU_MODEL = "Qwen/Qwen3-ASR-0.6B"
DEFAULT_CUDA_MODEL = "Qwen/Qwen3-ASR-1.7B"


class Settings(BaseSettings):
    """Server settings. Field names are the env var names, case-insensitive."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", protected_namespaces=())

    host: str = "127.0.0.1"
    """Interface to listen on."""
    port: int = Field(default=8100, ge=1, le=65535)
    """TCP port to listen on."""

    model_id: str | None = None
    """HF repo id, local directory, or `whisper-tiny.en` (bundled offline model).
    Empty: `Qwen/Qwen3-ASR-0.6B` on CPU, `Qwen/Qwen3-ASR-1.7B` on CUDA."""
    engine: Literal["auto", "qwen", "whisper", "remote"] = "auto"
    """Force an engine; `auto` picks it from what the model is. `remote` sends every job to
    the OpenAI-compatible backends in REMOTE_BACKENDS (vLLM, or more of these servers)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs. `auto` uses CUDA when torch sees a GPU."""
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    """Qwen weights dtype. `auto`: bfloat16 on a CUDA GPU that supports it, else float32."""
    attn_implementation: Literal["auto", "sdpa", "flash_attention_2", "eager"] = "auto"
    """Attention kernel for Qwen and its aligner. `auto`: flash-attention 2 where it works
    (installed, GPU compute capability 8+, bf16/fp16), else SDPA."""
    cpu_threads: int = Field(default=0, ge=0)
    """Threads for CPU inference; 0 lets the engine decide."""
    max_new_tokens: int = Field(default=1024, ge=1)
    """Upper bound on tokens the Qwen decoder generates per segment."""
    forced_aligner_id: str | None = None
    """Qwen3-ForcedAligner (HF id or directory, e.g. `Qwen/Qwen3-ForcedAligner-0.6B`) for word
    timestamps with the Qwen engine in its 11 languages; loaded on first use, unloaded with
    the model. Unset: word times are spread over each segment."""
    whisper_beam_size: int = Field(default=1, ge=1, le=10)
    """Beam width for the whisper engine; 1 (greedy) is fastest on CPU."""

    remote_backends: str | None = None
    """Remote engine: comma-separated base URLs of OpenAI-compatible transcription backends,
    e.g. `http://gpu-a:8000/v1,http://gpu-b:8000/v1`."""
    remote_model: str | None = None
    """Remote engine: the `model` sent to the backends. Unset: each backend's first model
    in its `/v1/models`."""
    remote_api_key: str | None = None
    """Remote engine: bearer key the backends expect (vLLM's `--api-key`)."""
    remote_max_inflight: int = Field(default=4, ge=1, le=256)
    """Remote engine: jobs sent to one backend at once. The front runs as many jobs at once
    as all backends together take."""
    remote_probe_interval: float = Field(default=5.0, gt=0, le=300)
    """Remote engine: seconds between health probes of a backend that is up; a backend that
    is down is probed again after 1, 2, 4 ... seconds up to this."""
    remote_connect_timeout: float = Field(default=2.0, gt=0, le=60)
    """Remote engine: seconds to connect to a backend (and to answer a probe) before it is
    taken out of the rotation."""

    engine_process: Literal["inline", "worker"] = "inline"
    """`worker` runs the engine in a child process (spawned on first use, ended when idle):
    an idle unload then gives back all memory the model runtime took, and a crash or a
    runaway job costs one request. `inline`: one process, torch imported lazily."""
    gateway_mode: bool = False
    """The seed's name for ENGINE_PROCESS=worker (true selects it)."""
    worker_kill_grace: float = Field(default=10.0, gt=0)
    """Worker mode: a job whose callers are gone but whose generation has not stopped this
    many seconds later (or that runs past REQUEST_TIMEOUT plus this) is killed with its
    worker, which restarts for the next job."""

    idle_timeout: float = Field(default=120.0, ge=0)
    """Seconds without use before the model is unloaded; 0 never unloads."""
    preload: bool = False
    """Load the model at start instead of on the first request."""
    request_timeout: float = Field(default=300.0, gt=0)
    """Seconds a job may wait in the queue and run before the request gets 504."""
    max_queue: int = Field(default=64, ge=1)
    """Pending inference jobs before new requests get 503."""
    max_batch_size: int = Field(default=4, ge=1, le=64)
    """Waiting batch-priority jobs with compatible options run as one engine batch of up to
    this many; 1 turns batching off. Real-time jobs are never batched."""

    max_upload_mb: float = Field(default=100.0, gt=0)
    """Largest accepted upload, in MB (10^6 bytes)."""
    max_audio_seconds: float = Field(default=3600.0, gt=0)
    """Longest accepted audio, in seconds."""

    segment_max_seconds: float = Field(default=30.0, ge=5, le=300)
    """Long audio is cut into segments of at most this length, at pauses; each is its own
    inference job."""
    segment_vad: bool = True
    """Find the pauses with Silero VAD (ONNX); false uses the quietest stretch (energy)."""

    asr_use_server_vad: bool = True
    """Default for streaming sessions: Silero VAD ends utterances at silence. Clients can
    override it per connection (`use_server_vad`)."""
    ws_partial_interval: float = Field(default=0.45, ge=0.1, le=10)
    """Seconds of new speech between two partial hypotheses of the open utterance."""
    ws_end_silence_ms: int = Field(default=500, ge=100, le=5000)
    """Silence that ends an utterance (final) when server VAD is on."""
    ws_vad_threshold: float = Field(default=0.5, gt=0, lt=1)
    """Speech probability above which a 32 ms frame counts as speech."""
    ws_max_utterance_s: float = Field(default=25.0, ge=5, le=30)
    """An utterance longer than this is finalized at its quietest point."""
    ws_window_max_s: float = Field(default=15.0, ge=2, le=30)
    """Partials re-decode at most the last this-many seconds of the open utterance."""
    ws_flush_silence_ms: int = Field(default=600, ge=0, le=3000)
    """Silence padded after the audio on flush, so trailing words are committed."""
    ws_max_frame_bytes: int = Field(default=1_048_576, ge=1024)
    """Largest accepted WebSocket message (binary PCM or JSON)."""
    ws_max_session_s: float = Field(default=3600.0, gt=0)
    """Longest audio a streaming session may send; then it is finalized and closed."""
    ws_max_pending_s: float = Field(default=60.0, ge=5, le=600)
    """Audio per streaming session that may wait for its finals. Past it the server stops
    reading that socket until finals catch up (back-pressure; the client's sends block)."""
    ws_max_sessions: int = Field(default=16, ge=1)
    """Concurrent streaming sessions; a further connection is refused with an error."""
    ws_idle_timeout: float = Field(default=60.0, gt=0)
    """A session that sends nothing for this many seconds is finalized and closed."""
    ws_outbox_size: int = Field(default=64, ge=4)
    """Events queued for a slow client; beyond it partials are dropped, and a client that
    does not read its finals is disconnected."""

    translate_base_url: str | None = None
    """OpenAI-compatible chat endpoint for /v1/audio/translations (e.g.
    `http://127.0.0.1:11434/v1`). Unset: translations answer 501."""
    translate_api_key: str | None = None
    """API key for the translation endpoint (any string if it needs none)."""
    translate_model: str | None = None
    """Chat model name for translations."""
    translate_timeout: float = Field(default=120.0, gt=0)
    """Seconds to wait for the translation model per call."""

    api_key: str | None = None
    """If set, every route but /health needs `Authorization: Bearer <API_KEY>`."""

    log_level: str = "INFO"
    """Minimum log level (DEBUG, INFO, WARNING, ...)."""
    log_json: bool = False
    """Write one JSON object per log line."""

    @property
    def remote_urls(self) -> list[str]:
        return [u.strip().rstrip("/") for u in (self.remote_backends or "").split(",") if u.strip()]

    @model_validator(mode="after")
    def _check_remote(self) -> Settings:
        if self.engine == "remote" and not self.remote_urls:
            raise ValueError(
                "ENGINE=remote needs REMOTE_BACKENDS, e.g. http://gpu-a:8000/v1,http://gpu-b:8000/v1"
            )
        for url in self.remote_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"REMOTE_BACKENDS: {url!r} is not an http(s) URL")
        return self

    @property
    def use_worker(self) -> bool:
        return self.engine_process == "worker" or self.gateway_mode

    def resolved_model_id(self, cuda: bool) -> str:
        """The model to serve; the default depends on the device."""
        if self.model_id:
            return self.model_id
        return DEFAULT_CUDA_MODEL if cuda else DEFAULT_CPU_MODEL

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1_000_000)
