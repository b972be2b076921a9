"""Our own Qwen3-ASR decode loop (issue 43): rows join and leave between steps.

Each row's prompt (chat template, audio encoder output) is prefilled with the rows taken
beside it (`prefill.py`: each row's positions and attention are its own, so its first token
is what it would be alone), its keys and values written into a static cache (`Cache`: one
slot per row in flight, allocated once). A decode step runs every row in flight together,
one token each: one embedding, one pass over the layers with the model's own modules
(norms, projections, rotary embedding, MLP), attention over each row's cached positions
only, and one LM head.
Rows in flight always occupy slots 0..n-1: a row that leaves has a row from beyond the new
count moved into its slot, so a step reads `[:n]` views of the cache, never a gather.

On CUDA the step is captured as a CUDA graph per batch-size bucket (1, 2, 4, 8, ...) and
kv-length bucket (256, 512, ... up to the cache's length), at load, before any row is in
flight: the running rows are padded to the next batch bucket (padding rows write into free
slots: the cache has a bucket's worth), attention reads the positions of the smallest kv
bucket that holds the longest row (not the whole cache), and every step is one graph
launch. torch is imported only inside calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


KV_SMALLEST = 256


def bucket(rows: int) -> int:
    """The captured batch size a step of `rows` rows runs at."""
    return next((b for b in BUCKETS if b >= rows), rows)


def kv_buckets(length: int) -> list[int]:
    """The kv lengths captured for a cache of `length` positions: 256, 512, ... and the
    cache's own length."""
    sizes = []
    size = KV_SMALLEST
    while size < length:
        sizes.append(size)
        size *= 2
    return [*sizes, length]


def kv_bucket(needed: int, length: int) -> int:
    """The captured kv length a step that reads `needed` positions runs at."""
    return next(b for b in kv_buckets(length) if b >= min(needed, length))


@dataclass
class Shape:
    layers: int
    kv_heads: int
    head_dim: int


class Cache:
    """Keys and values of every layer for `slots` rows of up to `length` tokens."""

    def __init__(self, shape: Shape, slots: int, length: int, device: Any, dtype: Any) -> None:
        import torch

        self.slots, self.length = slots, length
        size = (slots, shape.kv_heads, length, shape.head_dim)
        self.keys = [torch.zeros(size, device=device, dtype=dtype) for _ in range(shape.layers)]
        self.values = [torch.zeros(size, device=device, dtype=dtype) for _ in range(shape.layers)]

    @property
    def bytes(self) -> int:
        return sum(k.numel() * k.element_size() * 2 for k in self.keys)

    def move(self, source: int, target: int, length: int) -> None:
        for k, v in zip(self.keys, self.values, strict=True):
            k[target, :, :length] = k[source, :, :length]
            v[target, :, :length] = v[source, :, :length]


class Stepper:
    """One decode step over the rows in flight, with the thinker's own modules."""

    def __init__(self, thinker: Any, cache: Cache) -> None:
        self.text = thinker.model  # embed_tokens, layers, norm, rotary_emb
        self.head = thinker.lm_head
        self.cache = cache
        self.graphs: dict[tuple[int, int], Any] = {}  # (bucket, kv) -> CapturedStep (CUDA)

    def run(self, tokens: Any, positions: Any, kv_len: int) -> Any:
        """Logits [B, vocab] for `tokens` [B] at `positions` [B] (each row's length so far):
        row i is in slot i and attends to its positions ≤ its own. `kv_len` bounds the
        positions read (eager: the longest row + 1; a graph: its kv bucket)."""
        import torch

        rows = tokens.shape[0]
        hidden = self.text.embed_tokens(tokens)[:, None, :]
        cos, sin = self.text.rotary_emb(hidden, positions[:, None])
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, 1, head_dim], broadcast over heads
        span = torch.arange(kv_len, device=tokens.device)
        mask = (span[None, :] <= positions[:, None])[:, None, None, :]  # [B, 1, 1, kv_len]
        slots = torch.arange(rows, device=tokens.device)
        for index, layer in enumerate(self.text.layers):
            attn = layer.self_attn
            residual = hidden
            x = layer.input_layernorm(hidden)
            shape = (rows, 1, -1, attn.head_dim)
            q = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)
            k = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            keys, values = self.cache.keys[index], self.cache.values[index]
            keys[slots, :, positions] = k[:, :, 0]
            values[slots, :, positions] = v[:, :, 0]
            out = torch.nn.functional.scaled_dot_product_attention(
                q,
                keys[:rows, :, :kv_len],
                values[:rows, :, :kv_len],
                attn_mask=mask,
                scale=attn.scaling,
                enable_gqa=True,
            )
            hidden = residual + attn.o_proj(out.transpose(1, 2).reshape(rows, 1, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.head(self.text.norm(hidden))[:, 0]


def rotate(x: Any, cos: Any, sin: Any) -> Any:
    """RoPE as the model applies it (rotate_half)."""
    import torch

    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class CapturedStep:
    """The step for one batch bucket and kv length, captured as a CUDA graph on static
    input buffers."""

    def __init__(self, stepper: Stepper, rows: int, length: int, stream: Any) -> None:
        import torch

        device = stepper.cache.keys[0].device
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: kernels chosen, allocations made, off the graph
                stepper.run(self.tokens, self.positions, length)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=stream):
            self.logits = stepper.run(self.tokens, self.positions, length)

    def __call__(self, tokens: Any, positions: Any) -> Any:
        rows = tokens.shape[0]
        self.tokens[:rows].copy_(tokens)
        self.positions[:rows].copy_(positions)
        self.graph.replay()
        return self.logits[:rows]
