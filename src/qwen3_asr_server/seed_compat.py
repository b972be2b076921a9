"""The seed server's setting names, as `Settings` accepts them: the seed's names for settings
we have under our own (ours win), its defaults where they differ, and its settings that are
refused with the reason. The fields themselves are in `config.py` with the others (one
class); this module only maps and refuses, on the values alone: it imports nothing from the
package.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")
LOG_LEVEL_NAMES = {"WARN": "WARNING", "FATAL": "CRITICAL"}  # the seed's (stdlib) aliases
SEED_PCM_BYTES_PER_SECOND = 32000  # 16 kHz 16-bit mono PCM, the seed's WS_BUFFER_SIZE unit
# The seed's acceleration switches: refused when set to anything but their default.
REFUSED = {
    "use_speculative": "speculative decoding was not shown to help Qwen3-ASR here; for "
    "throughput use ENGINE=remote with vLLM backends (docs/SCALING.md)",
    "use_cuda_graphs": "CUDA graphs were not shown to help with variable-length audio; "
    "vLLM backends (ENGINE=remote) use them (docs/SCALING.md)",
    "onnx_encoder_path": "an ONNX encoder is not supported; the encoder runs in PyTorch, or "
    "in vLLM with ENGINE=remote",
    "trt_encoder_path": "a TensorRT encoder is not supported; use vLLM backends "
    "(ENGINE=remote) for GPU throughput",
    "numa_node": "NUMA pinning is left to the host: run the process under `numactl "
    "--cpunodebind=N --membind=N`",
    "use_granian": "the server runs on uvicorn only (its WebSocket and shutdown handling "
    "are what the tests prove)",
    "use_vllm": "superseded: run vLLM as its own server and set ENGINE=remote with "
    "REMOTE_BACKENDS (docs/SCALING.md)",
    "use_causal_encoder": "it was experimental in the seed and changes what the model "
    "computes; not shown to keep accuracy",
}
SEED_TRANSLATE_MODEL = "gemma3:12b"


def seed_settings(values: Mapping[str, Any], chosen: Set[str], notes: list[str]) -> dict[str, Any]:
    """The settings' `values` with the seed's names mapped onto ours: the fields to change
    (ours win; `chosen` are the fields set explicitly). What was overridden or has no effect
    is appended to `notes` (logged at start); what is not offered raises ValueError."""
    updates: dict[str, Any] = {}
    for seed, ours in (
        ("openai_base_url", "translate_base_url"),
        ("openai_api_key", "translate_api_key"),
    ):
        if values[seed] is None:
            continue
        if values[ours] is None:
            updates[ours] = values[seed]
        elif values[ours] != values[seed]:
            notes.append(f"{seed.upper()} is ignored: {ours.upper()} is set and wins")
    if values["openai_base_url"] is not None and values["translate_model"] is None:
        updates["translate_model"] = SEED_TRANSLATE_MODEL
        notes.append(f"TRANSLATE_MODEL unset: the seed's default {SEED_TRANSLATE_MODEL} is used")
    if values["ws_buffer_size"] is not None:
        if "ws_partial_interval" in chosen:
            notes.append("WS_BUFFER_SIZE is ignored: WS_PARTIAL_INTERVAL is set and wins")
        else:
            updates["ws_partial_interval"] = max(
                0.1, values["ws_buffer_size"] / SEED_PCM_BYTES_PER_SECOND
            )
    if values["sse_overlap_seconds"]:
        notes.append("SSE_OVERLAP_SECONDS has no effect: segments are cut at pauses")
    if values["ws_overlap_size"]:
        notes.append("WS_OVERLAP_SIZE has no effect: partials re-decode the utterance")
    if values["worker_host"] is not None or values["worker_port"] is not None:
        notes.append("WORKER_HOST/WORKER_PORT have no effect: the worker talks over a pipe")
    refuse_quantize(values["quantize"], values["dtype"], values["device"])
    for name, reason in REFUSED.items():
        if values[name] not in (None, False, 0):  # the seed's defaults pass
            raise ValueError(f"{name.upper()} is not offered: {reason}")
    return updates


def refuse_quantize(quantize: str | None, dtype: str, device: str) -> None:
    """The seed's QUANTIZE values that cannot run here (ValueError)."""
    if quantize == "fp8":
        raise ValueError(
            "QUANTIZE=fp8 is not available: it needs a CUDA GPU of compute capability "
            "8.9+ with torchao, not built or tested here; use DTYPE=bfloat16"
        )
    if quantize == "int8" and dtype in ("bfloat16", "float16"):
        raise ValueError(
            f"QUANTIZE=int8 quantizes float32 weights for the CPU; DTYPE={dtype} "
            "cannot run with it (every request would fail): use DTYPE=auto or float32"
        )
    if quantize == "int8" and device == "cuda":
        raise ValueError(
            "QUANTIZE=int8 is implemented on CPU only (the seed's bitsandbytes GPU path is "
            "not offered); on CUDA use DTYPE=bfloat16"
        )


def log_level(value: str) -> str:
    """LOG_LEVEL as loguru names it; the seed's (stdlib) WARN and FATAL are accepted."""
    level = LOG_LEVEL_NAMES.get(value.strip().upper(), value.strip().upper())
    if level not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)} (or WARN, FATAL)")
    return level
