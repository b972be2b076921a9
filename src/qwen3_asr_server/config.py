"""Every setting of the server, read from the environment or `.env`, in one class.
Nothing else in the package reads `os.environ`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .logging import redact_url
from .seed_compat import log_level, seed_settings


class Settings(BaseSettings):
    """Server settings. Field names are the env var names, case-insensitive."""

    # An empty value (`NAME=`, as the seed's .env.example has them) means unset.
    # Each field's docstring is its description (the CLI's --help, .env.example).
    model_config = SettingsConfigDict(
        env_file=".env",
        extra="ignore",
        protected_namespaces=(),
        env_ignore_empty=True,
        use_attribute_docstrings=True,
    )
    _notes: list[str] = PrivateAttr(default_factory=list)

    host: str = "127.0.0.1"
    """Interface to listen on."""
    port: int = Field(default=8100, ge=1, le=65535)
    """TCP port to listen on."""
    ssl_certfile: Path | None = None
    """TLS certificate (PEM, with its chain): the server speaks https and wss itself.
    Needs SSL_KEYFILE."""
    ssl_keyfile: Path | None = None
    """TLS private key (PEM) for SSL_CERTFILE."""

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
    dual_model: bool = False
    """Load FAST_MODEL_ID beside MODEL_ID (both load and unload together): streaming
    partials run on the fast model, finals, uploads and subtitles on the main one."""
    fast_model_id: str = "Qwen/Qwen3-ASR-0.6B"
    """The partials' model when DUAL_MODEL is true: a Qwen checkpoint, or a whisper model
    (e.g. `whisper-tiny.en`, then only for sessions whose language is English)."""
    quantize: Literal["int8", "fp8"] | None = None
    """`int8`: on CPU, dynamic int8 quantization of the Qwen decoder's linear layers (whisper
    is int8 on CPU already). Refused at start: `int8` with DEVICE=cuda, and `fp8`."""
    forced_aligner_id: str | None = None
    """Qwen3-ForcedAligner (HF id or directory, e.g. `Qwen/Qwen3-ForcedAligner-0.6B`) for word
    timestamps with the Qwen engine in its 11 languages; loaded on first use, unloaded with
    the model. Unset: word times are spread over each segment."""
    whisper_beam_size: int = Field(default=5, ge=1, le=10)
    """Beam width for the whisper engine's finals and uploads (streaming partials are always
    greedy). 5, faster-whisper's and OpenAI's default, halves tiny.en's errors on the test
    sentences for ~15% more time per short clip; 1 (greedy) is fastest."""

    remote_backends: str | None = None
    """Remote engine: comma-separated base URLs of OpenAI-compatible transcription backends,
    e.g. `http://gpu-a:8000/v1,http://gpu-b:8000/v1`. Credentials in a URL
    (`http://user:pass@host/v1`) are sent to that backend as HTTP Basic auth (instead of
    REMOTE_API_KEY) and shown as `user:***` everywhere."""
    remote_model: str | None = None
    """Remote engine: the `model` sent to the backends. Unset: each backend's first model
    in its `/v1/models`."""
    remote_api_key: str | None = None
    """Remote engine: bearer key the backends expect (vLLM's `--api-key`); not sent to a
    backend whose URL carries credentials."""
    remote_max_inflight: int = Field(default=4, ge=1, le=256)
    """Remote engine: jobs sent to one backend at once, never more (while other backends are down,
    jobs wait for a slot). The front runs as many jobs at once as all backends together take."""
    remote_probe_interval: float = Field(default=5.0, gt=0, le=300)
    """Remote engine: seconds between health probes of a backend that is up; a backend that
    is down is probed again after 1, 2, 4 ... seconds up to this."""
    remote_call_timeout: float | None = Field(default=None, gt=0)
    """Remote engine: seconds one backend has to answer one job before the job is retried on
    another backend; unset: half of REQUEST_TIMEOUT with two or more backends (the retry fits
    in the job's time), all of it with one (nowhere to retry). A
    backend that timed out on a job stays out of the rotation until a short trial job
    succeeds (its `/v1/models` answering is not enough: the engine behind it may hang)."""
    remote_connect_timeout: float = Field(default=2.0, gt=0, le=60)
    """Remote engine: seconds to connect to a backend (and to answer a probe) before it is
    taken out of the rotation."""

    engine_process: Literal["inline", "worker"] = "inline"
    """`worker` runs the engine in a child process (spawned on first use, ended when idle):
    an idle unload then gives back all memory the model runtime took, and a crash or a
    runaway job costs one request. `inline`: one process, torch imported lazily."""
    gateway_mode: bool = False
    """The seed's name for ENGINE_PROCESS=worker (true selects it)."""
    worker_host: str | None = None
    """Accepted from the seed's settings and not used: the worker is a child process that
    talks over a pipe, not HTTP (a note is logged if set)."""
    worker_port: int | None = None
    """Accepted from the seed's settings and not used (see WORKER_HOST)."""
    worker_kill_grace: float = Field(default=10.0, gt=0)
    """Worker mode: a job whose callers are gone but whose generation has not stopped this
    many seconds later (or that runs past REQUEST_TIMEOUT plus this) is killed with its
    worker, which restarts for the next job."""

    idle_timeout: float = Field(default=120.0, ge=0)
    """Seconds without use before the model is unloaded; 0 never unloads."""
    preload: bool = False
    """Load the model at start instead of on the first request."""
    request_timeout: float = Field(default=300.0, gt=0)
    """Seconds a job may wait in the queue and run before the request gets 504. Also the
    longest a request waits for a model load: then 503 `model_loading` (the load goes on)."""
    max_queue: int = Field(default=64, ge=1)
    """Pending inference jobs before new requests get 503."""
    shutdown_timeout: float = Field(default=20.0, ge=0)
    """Seconds a shutdown (SIGTERM, Ctrl-C) waits for the streaming sessions' finals, then
    for open requests and sockets; what is still running then is stopped, and the finals not
    transcribed are logged. A second signal stops it at once; 0 stops the streams at once."""
    max_batch_size: int = Field(default=4, ge=1, le=64)
    """Rows decoded together. Qwen (QWEN_DECODE=steps): the rows in flight, uploads' segments
    and streams' partials and finals alike, joining and leaving between decode steps; each
    holds a static KV cache of KV_CACHE_TOKENS. Whisper: waiting upload jobs run as one
    batch of up to this many. 1 turns batching off."""
    qwen_decode: Literal["steps", "generate"] = "steps"
    """Qwen's decode loop: `steps` (a static KV cache, rows join and leave between steps;
    CUDA graphs on CUDA) or `generate` (transformers' generate on padded batches)."""
    kv_cache_tokens: int = Field(default=1024, ge=256, le=32768)
    """Tokens of static KV cache per row in flight (prompt, audio and answer; 30 s of speech
    needs about 800). Allocated at load: MAX_BATCH_SIZE rows × this (docs/GPU.md). A
    longer row is decoded alone with `generate`."""
    cuda_graphs: Literal["auto", "off"] = "auto"
    """The decode step as CUDA graphs (one per batch-size bucket): `auto` on CUDA only."""

    max_upload_mb: float = Field(default=100.0, gt=0)
    """Largest accepted upload, in MB (10^6 bytes)."""
    max_audio_seconds: float = Field(default=3600.0, gt=0)
    """Longest accepted audio, in seconds."""
    diarize_max_seconds: float = Field(default=3600.0, gt=0)
    """Longest audio diarized (speakers), in seconds; longer gets 413 (docs/SPEAKERS.md)."""
    diarize_features: Literal["auto", "portable", "native"] = "auto"
    """How the diarizer computes its filterbank features: `portable` (kaldi-native-fbank, any
    x86-64 or ARM CPU), `native` (senko's own library, built for AVX-512 only: elsewhere it
    dies with SIGILL and each diarized request gets 503), or `auto`: native only on a CPU
    with AVX-512 (F, BW, DQ, VL), else portable (docs/SPEAKERS.md)."""
    diarize_preload: bool = True
    """With PRELOAD=true and the diarize extra installed, the diarizer's child process starts
    with the model, each time it loads, so the first diarized request does not wait for it;
    false: it starts on the first diarized request (and never costs memory before one)."""
    max_pending_audio_seconds: float = Field(default=14400.0, gt=0)
    """Seconds of decoded audio that all uploads together may hold in memory (float32 at
    16 kHz: 4 hours is about 0.9 GB). An upload that would go past it gets 503 with
    Retry-After before it is decoded, or at the first decoded block past it when its header
    gives no duration or a wrong one."""

    segment_max_seconds: float = Field(default=30.0, ge=5, le=300)
    """Long audio is cut into segments of at most this length, at pauses; each is its own
    inference job."""
    compact_pauses_ms: int = Field(default=150, ge=0, le=10000)
    """Before a long file (longer than one segment) is cut, each pause longer than this
    (quiet, about -40 dB below its loud parts) is shortened to it: fewer 30 s windows to
    decode. Times in the answer are on the original timeline. 0 keeps the audio as is."""
    segment_vad: bool = True
    """Find the pauses with Silero VAD (ONNX); false uses the quietest stretch (energy).
    With VAD, a quiet segment (under -35 dBFS) in which it hears no speech is not
    transcribed: silence answers empty text, not the words models invent in it."""

    sse_chunk_seconds: float | None = Field(default=None, ge=5, le=300)
    """The seed's SSE chunk length: here it caps the segment length of the streaming routes
    (`stream=true` and /v1/audio/transcriptions/stream), which still cut at pauses. Unset:
    SEGMENT_MAX_SECONDS."""
    sse_overlap_seconds: float | None = Field(default=None, ge=0, le=30)
    """Accepted from the seed's settings and not used: segments are cut at pauses, so no
    overlap is decoded twice and nothing needs to be merged (a note is logged if set)."""

    asr_use_server_vad: bool = True
    """Default for streaming sessions: Silero VAD ends utterances at silence. Clients can
    override it per connection (`use_server_vad`)."""
    ws_partial_interval: float = Field(default=0.45, ge=0.1, le=10)
    """Seconds of new speech between two partial hypotheses of the open utterance."""
    ws_buffer_size: int | None = Field(default=None, ge=3200, le=320000)
    """The seed's partial cadence in bytes of new 16 kHz 16-bit audio (14400 = 0.45 s): when
    set and WS_PARTIAL_INTERVAL is not, it sets WS_PARTIAL_INTERVAL (bytes / 32000)."""
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
    ws_overlap_size: int | None = None
    """Accepted from the seed's settings and not used: partials re-decode the open
    utterance's window, so no overlap between chunks exists (a note is logged if set)."""
    ws_max_frame_bytes: int = Field(default=1_048_576, ge=1024)
    """Largest accepted WebSocket message (binary PCM or JSON)."""
    ws_max_session_s: float = Field(default=3600.0, gt=0)
    """Longest audio a streaming session may send; then it is finalized and closed."""
    ws_max_pending_s: float = Field(default=60.0, ge=5, le=600)
    """Audio per streaming session that may wait for its finals. Past it the server stops
    reading that socket until finals catch up (back-pressure; the client's sends block)."""
    ws_speaker_wait_s: float = Field(default=0.5, gt=0, le=10)
    """Live speakers (`diarize=true`): how long a final whose text is ready waits for its
    speaker; past it the final goes out with `"speaker": null` (docs/SPEAKERS.md)."""
    ws_max_sessions: int = Field(default=16, ge=1)
    """Concurrent streaming sessions; a further connection is refused with an error."""
    ws_idle_timeout: float = Field(default=60.0, gt=0)
    """A session that sends nothing for this many seconds is finalized and closed."""
    deepgram_idle_timeout_s: float = Field(default=10.0, gt=0)
    """WS /v1/listen: no audio nor KeepAlive this long -> finalized, closed (1011 NET-0001)."""
    listen_url_hosts: str | None = None
    """Hosts POST /v1/listen may fetch a JSON body's `url` from (`a.org,*.b.org`); empty: none."""
    ws_outbox_size: int = Field(default=64, ge=4)
    """Events queued for a slow client; beyond it partials are dropped, and a client that
    does not read its finals is disconnected."""

    translate_base_url: str | None = None
    """OpenAI-compatible chat endpoint for /v1/audio/translations (e.g.
    `http://127.0.0.1:11434/v1`). Unset: translations answer 501."""
    translate_api_key: str | None = None
    """API key for the translation endpoint (any string if it needs none)."""
    openai_base_url: str | None = None
    """The seed's name for TRANSLATE_BASE_URL (TRANSLATE_BASE_URL wins if both are set)."""
    openai_api_key: str | None = None
    """The seed's name for TRANSLATE_API_KEY (TRANSLATE_API_KEY wins if both are set)."""
    translate_temperature: float = Field(default=0.3, ge=0, le=2)
    """Sampling temperature of the translation model for text."""
    translate_srt_temperature: float = Field(default=0.1, ge=0, le=2)
    """Sampling temperature of the translation model for subtitles (keeps the cue count)."""
    translate_model: str | None = None
    """Chat model name for translations. Unset with the seed's OPENAI_BASE_URL: the seed's
    default, `gemma3:12b`."""
    translate_timeout: float = Field(default=120.0, gt=0)
    """Seconds to wait for the translation model per call."""

    subtitle_max_duration: float = Field(default=7.0, ge=1, le=60)
    """Longest subtitle cue, in seconds (/v1/audio/subtitles, srt translations)."""
    subtitle_min_duration: float = Field(default=0.833, ge=0, le=10)
    """A shorter cue is stretched toward this, without reaching into the next cue."""
    subtitle_pause_threshold: float = Field(default=0.5, gt=0, le=10)
    """A pause between two words at least this long starts a new cue."""
    subtitle_min_gap: float = Field(default=0.083, ge=0, le=2)
    """Seconds kept between the end of a cue and the start of the next."""

    api_key: str | None = None
    """If set, every HTTP route needs `Authorization: Bearer <API_KEY>` (checked before the
    body is read), except /health, the browser page and the API docs (README: Auth and CORS)."""
    cors_allow_origins: str | None = None
    """Comma-separated origins (`https://app.example.com`, or `*`) whose browser apps may
    call the API (CORS, preflights included). Empty: no CORS headers."""

    log_level: str = "INFO"
    """Minimum log level: TRACE, DEBUG, INFO, SUCCESS, WARNING (WARN), ERROR, CRITICAL (FATAL)."""
    log_json: bool = False
    """Write one JSON object per log line."""

    use_speculative: bool = False
    """Seed setting, not offered: refused at start if true (docs/MIGRATING.md)."""
    use_cuda_graphs: bool = False
    """Seed setting, not offered: refused at start if true (docs/MIGRATING.md)."""
    onnx_encoder_path: str | None = None
    """Seed setting, not offered: refused at start if set (docs/MIGRATING.md)."""
    trt_encoder_path: str | None = None
    """Seed setting, not offered: refused at start if set (docs/MIGRATING.md)."""
    numa_node: int | None = None
    """Seed setting, not offered: refused at start if set (docs/MIGRATING.md)."""
    use_granian: bool = False
    """Seed setting, not offered: refused at start if true (docs/MIGRATING.md)."""
    use_vllm: bool = False
    """Seed setting, superseded: refused at start if true; use ENGINE=remote with vLLM
    backends (docs/SCALING.md)."""
    use_causal_encoder: bool = False
    """Seed setting (experimental there), not offered: refused at start if true."""
    pytorch_cuda_alloc_conf: str | None = None
    """PyTorch's CUDA allocator options (e.g. `expandable_segments:True`), exported to the
    process environment before torch is imported, if not already set there."""

    @field_validator("model_id", "fast_model_id", "forced_aligner_id")
    @classmethod
    def _home(cls, value: str | None) -> str | None:
        """`~/models/x` as the shell would expand it (a .env file does not)."""
        return os.path.expanduser(value) if value and value.startswith("~") else value

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        return log_level(value)

    @model_validator(mode="after")
    def _seed_names(self) -> Settings:
        """The seed's names (ours win) and refusals; what has no effect goes to `notes`."""
        for name, value in seed_settings(dict(self), self.model_fields_set, self._notes).items():
            setattr(self, name, value)
        return self

    def notes(self) -> list[str]:
        """Start-up log lines about seed settings that were overridden or have no effect."""
        return list(self._notes)

    @property
    def remote_urls(self) -> list[str]:
        return [u.strip().rstrip("/") for u in (self.remote_backends or "").split(",") if u.strip()]

    @property
    def cors_origins(self) -> list[str]:
        return [
            o.strip().rstrip("/") for o in (self.cors_allow_origins or "").split(",") if o.strip()
        ]

    @model_validator(mode="after")
    def _check_tls(self) -> Settings:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("TLS needs both SSL_CERTFILE and SSL_KEYFILE (PEM files).")
        for name, path in (("SSL_CERTFILE", self.ssl_certfile), ("SSL_KEYFILE", self.ssl_keyfile)):
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: {path} is not a readable file.")
        return self

    @model_validator(mode="after")
    def _check_remote(self) -> Settings:
        if self.engine == "remote" and not self.remote_urls:
            raise ValueError(
                "ENGINE=remote needs REMOTE_BACKENDS, e.g. http://gpu-a:8000/v1,http://gpu-b:8000/v1"
            )
        for url in self.remote_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"REMOTE_BACKENDS: {redact_url(url)!r} is not an http(s) URL")
        return self

    @property
    def use_worker(self) -> bool:
        return self.engine_process == "worker" or self.gateway_mode

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1_000_000)
