"""Loading Qwen3-ASR checkpoints: device, dtype and attention choices (pure functions, no
heavy imports) and a loader that refuses checkpoints with missing weights."""

from __future__ import annotations

from typing import Any

from loguru import logger

from ...audio.pcm import SAMPLE_RATE
from ...errors import ModelLoadError
from ...text import language_name
from ...transcript import Word
from ..base import TranscribeRequest
from .encoder import install
from .rows import padded
from .word_times import words_from_items

FLASH = "flash_attention_2"


def choose_dtype(setting: str, cuda: bool, bf16_supported: bool) -> str:
    """`auto`: bfloat16 on a GPU that supports it, else float32 (fp16 overflows to NaN in
    this model, which decodes as "!"); float32 on CPU."""
    if setting != "auto":
        return setting
    return "bfloat16" if cuda and bf16_supported else "float32"


def choose_attention(
    setting: str, cuda: bool, dtype: str, flash_available: bool, capability: tuple[int, int]
) -> str:
    """flash-attention 2 only where it works: installed, on a GPU of compute capability 8+,
    in bf16/fp16 (transformers merely warns otherwise, then every request fails in the
    kernel). An explicit setting that cannot work is an error, not a silent switch."""
    flash_ok = (
        cuda and flash_available and dtype in ("bfloat16", "float16") and capability >= (8, 0)
    )
    if setting == FLASH and not flash_ok:
        raise ModelLoadError(
            "ATTN_IMPLEMENTATION=flash_attention_2 needs the flash-attn package, a CUDA GPU of "
            "compute capability 8.0 or newer and DTYPE bfloat16 or float16 (here: "
            f"cuda={cuda}, flash-attn={flash_available}, capability={capability}, "
            f"dtype={dtype}). Use ATTN_IMPLEMENTATION=auto or sdpa."
        )
    if setting != "auto":
        return setting
    return FLASH if flash_ok else "sdpa"


def load_checkpoint(path: str, setting: str, **kwargs: Any) -> Any:
    """`AutoModel.from_pretrained` that fails when weights are missing: transformers would
    initialise them randomly and, with its logging muted, say nothing (garbage output)."""
    from transformers import AutoModel

    model, info = AutoModel.from_pretrained(path, output_loading_info=True, **kwargs)
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        unexpected = sorted(info.get("unexpected_keys") or [])
        shown = ", ".join(missing[:10]) + (
            f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        )
        hint = (
            f" The checkpoint has unexpected weights instead: {', '.join(unexpected[:5])}."
            if unexpected
            else ""
        )
        raise ModelLoadError(
            f"{setting}={path!r} is missing {len(missing)} weights ({shown}); they would run on "
            f"random values and produce garbage.{hint} Is it a complete Qwen3-ASR checkpoint "
            "of a supported version?"
        )
    return model


def quantize_int8(network: Any) -> None:
    """QUANTIZE=int8 on CPU: PyTorch dynamic int8 quantization (int8 weights, activations
    quantized per call) of the decoder's linear layers and the LM head, in place. The audio
    encoder stays float32. Measured in bench/quantize.py."""
    import gc
    import warnings

    import torch
    from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic

    spec = {"model": default_dynamic_qconfig, "lm_head": default_dynamic_qconfig}
    mapping = {torch.nn.Linear: torch.ao.nn.quantized.dynamic.Linear}  # not the embeddings
    with warnings.catch_warnings():  # torch marks the qint8 tensor API as deprecated
        warnings.simplefilter("ignore")
        quantize_dynamic(
            network.thinker, qconfig_spec=spec, dtype=torch.qint8, mapping=mapping, inplace=True
        )
    # The replaced float layers sit in reference cycles: without this they stay in memory
    # (measured: 4.8 GB RSS instead of 2.6 GB for the 0.6B shape).
    gc.collect()


def load_hint(model_id: str, exc: Exception, setting: str = "MODEL_ID") -> str:
    reason = f"{type(exc).__name__}: {exc}".strip()
    if len(reason) > 400:
        reason = reason[:400] + "..."
    return (
        f"Could not load {model_id!r} ({setting}: {reason}). "
        f"Run `qwen3-asr-server download {model_id}`; if this machine is offline, run "
        f"`qwen3-asr-server download {model_id} --to DIR` where it has internet, copy DIR "
        f"here and set {setting}=DIR. `qwen3-asr-server check` lists what else is missing. "
        "MODEL_ID=whisper-tiny.en serves the bundled offline model instead."
    )


def load_aligner(path: str, kwargs: dict[str, Any]) -> Any:
    """Loaded with the model (not on first use inside the inference thread, where a load
    or a download would stall every stream), with the same device, dtype, attention."""
    from qwen_asr.inference.qwen3_forced_aligner import (
        Qwen3ForceAlignProcessor,
        Qwen3ForcedAligner,
    )
    from transformers import AutoProcessor

    try:
        network = load_checkpoint(path, "FORCED_ALIGNER_ID", **kwargs)
        install(network.thinker, gpu=kwargs.get("device_map") != "cpu")
        processor = AutoProcessor.from_pretrained(path, fix_mistral_regex=True)
        return Qwen3ForcedAligner(network, processor, Qwen3ForceAlignProcessor())
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(load_hint(path, exc, "FORCED_ALIGNER_ID")) from exc


# The languages Qwen3-ForcedAligner aligns (ISO codes).
ALIGNER_LANGUAGES = frozenset({"zh", "en", "yue", "fr", "de", "it", "ja", "ko", "pt", "ru", "es"})


def aligned_words(
    aligner: Any, requests: list[TranscribeRequest], texts: list[str], languages: list[str | None]
) -> dict[int, list[Word]]:
    """Word (CJK: character) times from Qwen3-ForcedAligner for every request that asks,
    in one `align` call; each word keeps the transcript's own text."""
    wanted = [
        i
        for i, r in enumerate(requests)
        if r.word_timestamps and texts[i] and languages[i] in ALIGNER_LANGUAGES
    ]
    if not wanted:
        return {}
    aligned = aligner.align(
        audio=[(padded(requests[i].audio), SAMPLE_RATE) for i in wanted],
        text=[texts[i] for i in wanted],
        language=[language_name(languages[i]) for i in wanted],
    )
    out: dict[int, list[Word]] = {}
    for i, result in zip(wanted, aligned, strict=True):
        duration = len(requests[i].audio) / SAMPLE_RATE
        words = words_from_items(texts[i], list(result.items), duration)
        if words is None:
            logger.warning("aligner tokens do not match the transcript; times are spread")
            continue
        out[i] = words
    return out
