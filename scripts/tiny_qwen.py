"""Build a tiny random-weight Qwen3-ASR checkpoint (real architecture, ~70 k parameters).

Used by the tests and benchmarks, since the real weights cannot be downloaded here.
    python scripts/tiny_qwen.py /tmp/tiny-qwen
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|im_start|>system\n{{ message['content'] }}<|im_end|>\n"
    "{% elif message['role'] == 'user' %}<|im_start|>user\n"
    "<|audio_start|><|audio_pad|><|audio_end|><|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer(out: Path, extra: tuple[str, ...] = ()) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIAL + list(extra),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["language English<asr_text>hello world the quick brown fox", "system user assistant"]
    tok.train_from_iterator(corpus * 10, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2TokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "model_max_length": 32768,
        "chat_template": CHAT_TEMPLATE,
        "extra_special_tokens": {
            "audio_token": "<|audio_pad|>",
            "audio_bos_token": "<|audio_start|>",
            "audio_eos_token": "<|audio_end|>",
        },
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    vocab_size = tok.get_vocab_size()
    return vocab_size


# Random-weight stand-ins of the real models' shapes (bench/gpu_check.py), from the published
# configs: Qwen3-0.6B / Qwen3-1.7B decoders and their audio encoders.
SHAPES: dict[str, tuple[dict[str, object], dict[str, object]]] = {
    "0.6b": (
        dict(
            encoder_layers=18,
            encoder_attention_heads=14,
            encoder_ffn_dim=3584,
            d_model=896,
            output_dim=1024,
            downsample_hidden_size=480,
        ),
        dict(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
        ),
    ),
    "1.7b": (
        dict(
            encoder_layers=24,
            encoder_attention_heads=16,
            encoder_ffn_dim=4096,
            d_model=1024,
            output_dim=2048,
            downsample_hidden_size=480,
        ),
        dict(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
        ),
    ),
}


def build(out_dir: str | Path, aligner: bool = False, shape: str = "tiny", seed: int = 0) -> Path:
    """Write the checkpoint to `out_dir` (created) and return its path.

    `aligner=True` builds a Qwen3-ForcedAligner instead: the same architecture with a
    `<timestamp>` token whose predicted class ids are read as multiples of 80 ms.
    `shape` "0.6b"/"1.7b" builds random weights of the real models' sizes (bf16 on disk)
    with the same small tokenizer.
    """
    from qwen_asr.core.transformers_backend import (
        Qwen3ASRConfig,
        Qwen3ASRForConditionalGeneration,
    )
    from tokenizers import Tokenizer
    from transformers import WhisperFeatureExtractor

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = _tokenizer(out, ("<timestamp>",) if aligner else ())
    ids = Tokenizer.from_file(str(out / "tokenizer.json"))
    audio = dict(
        num_mel_bins=128,
        encoder_layers=2,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        d_model=32,
        output_dim=32,
        downsample_hidden_size=16,
        n_window=50,
        n_window_infer=800,
    )
    text = dict(
        vocab_size=max(vocab_size, 320),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        rope_scaling={"rope_type": "default", "mrope_section": [4, 2, 2], "interleaved": True},
    )
    if shape != "tiny":
        big_audio, big_text = SHAPES[shape]
        audio.update(big_audio)
        head = int(big_text["head_dim"]) // 2  # mrope sections sum to head_dim / 2
        text.update(
            big_text,
            rope_scaling={
                **text["rope_scaling"],
                "mrope_section": [head - 2 * (head * 5 // 16), head * 5 // 16, head * 5 // 16],
            },
        )  # type: ignore[dict-item]
    cfg = Qwen3ASRConfig(
        thinker_config=dict(
            audio_config=audio,
            text_config=text,
            audio_token_id=ids.token_to_id("<|audio_pad|>"),
            audio_start_token_id=ids.token_to_id("<|audio_start|>"),
        ),
        support_languages=["English", "Chinese"],
        **(
            {"timestamp_token_id": ids.token_to_id("<timestamp>"), "timestamp_segment_time": 80}
            if aligner
            else {}
        ),
    )
    import torch

    torch.manual_seed(seed)  # the same weights every build: tests see the same outputs
    model = Qwen3ASRForConditionalGeneration(cfg)
    if shape != "tiny":
        import torch

        model = model.to(torch.bfloat16)
    model.save_pretrained(str(out))
    WhisperFeatureExtractor(feature_size=128).save_pretrained(str(out))
    (out / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen3ASRProcessor"}))
    return out


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else "tiny-qwen", aligner="--aligner" in sys.argv))
