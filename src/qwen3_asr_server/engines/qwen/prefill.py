"""The lean prefill of the step path (issue 50): the rows taken together go through the
text model once, with the model's own modules, as `steps.Stepper` runs a decode step.

- The processor's output (token ids, log-mel features) is turned into host values once:
  each row's ids without padding, its feature frames.
- The audio encoder is ours (`encoder.AudioEncoder`: every row's windows in one batch).
- Rows are right-padded: every row's positions count from 0, and causal attention alone
  keeps a real token from seeing the padding after it (the padding's own outputs are never
  read), so attention runs without a mask.
- Keys and values are written straight into the rows' cache slots, layer by layer.
- The LM head runs at each row's last position only.
Nothing is read back from the device here: the caller chooses the first tokens of all rows
at once. torch is imported only inside calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .encoder import AudioEncoder
from .steps import Cache, rotate

TOKEN_BUCKET = 64  # prompt lengths padded to a multiple of this on CUDA (few new shapes)


@dataclass
class Prompts:
    """The rows' prompts as host values: each row's token ids, and its log-mel features
    (a host tensor [rows, mel, frames]) with its valid frames."""

    ids: list[np.ndarray]
    features: Any
    frames: list[int]

    @classmethod
    def of(cls, inputs: Any) -> Prompts:
        """From the SDK processor's (left-padded) output, on the host."""
        mask = inputs["attention_mask"].numpy().astype(bool)
        ids = inputs["input_ids"].numpy()
        frames = inputs["feature_attention_mask"].numpy().sum(1)
        return cls([ids[i][mask[i]] for i in range(len(ids))], inputs["input_features"].numpy(),
                   [int(f) for f in frames])  # fmt: skip

    @classmethod
    def join(cls, parts: list[Prompts]) -> Prompts:
        """The rows of several prompts as one (features zero-padded to the longest)."""
        longest = max(p.features.shape[2] for p in parts)
        rows = sum(len(p.ids) for p in parts)
        features = np.zeros((rows, parts[0].features.shape[1], longest), dtype=np.float32)
        row = 0
        for part in parts:
            features[row : row + len(part.ids), :, : part.features.shape[2]] = part.features
            row += len(part.ids)
        return cls(
            [i for p in parts for i in p.ids], features, [f for p in parts for f in p.frames]
        )

    def lengths(self) -> list[int]:
        return [len(r) for r in self.ids]


class Prefiller:
    def __init__(self, thinker: Any, cache: Cache, encoder: AudioEncoder, buckets: bool) -> None:
        self.text = thinker.model  # embed_tokens, layers, norm, rotary_emb
        self.head = thinker.lm_head
        self.audio_token = int(thinker.config.audio_token_id)
        self.cache = cache
        self.encoder = encoder
        self.buckets = buckets

    def width(self, longest: int) -> int:
        """The padded prompt length of a prefill whose longest prompt is `longest`."""
        if not self.buckets:
            return longest
        return min(self.cache.length, -(-longest // TOKEN_BUCKET) * TOKEN_BUCKET)

    def __call__(self, prompts: Prompts, first: int) -> Any:
        """Prefill the rows into slots `first`, `first + 1`, ...; the logits [rows, vocab]
        at each row's last prompt token (on the device)."""
        import torch

        lengths = prompts.lengths()
        rows, width = len(lengths), self.width(max(lengths))
        ids = np.zeros((rows, width), dtype=np.int64)
        for i, row in enumerate(prompts.ids):
            ids[i, : len(row)] = row
        places = np.flatnonzero(ids.reshape(-1) == self.audio_token)
        expected = sum(self.encoder.plan(prompts.frames).per_row)
        if len(places) != expected:
            raise ValueError(
                f"the prompts hold {len(places)} audio tokens for {expected} encoder outputs"
            )
        device = self.cache.keys[0].device
        tokens = torch.from_numpy(ids).to(device, non_blocking=True)
        hidden = self.text.embed_tokens(tokens)
        audio = self.encoder(prompts.features, prompts.frames).to(hidden.dtype)
        where = torch.from_numpy(places).to(device, non_blocking=True)
        hidden = hidden.reshape(rows * width, -1).index_copy(0, where, audio)
        hidden = hidden.reshape(rows, width, -1)
        positions = torch.arange(width, device=device)[None].expand(rows, width)
        cos, sin = self.text.rotary_emb(hidden, positions)
        cos, sin = cos[:, None], sin[:, None]  # [rows, 1, width, head_dim]
        for index, layer in enumerate(self.text.layers):
            hidden = self._layer(index, layer, hidden, cos, sin, first)
        last = torch.tensor([n - 1 for n in lengths], dtype=torch.long)
        picked = hidden[torch.arange(rows), last.to(device, non_blocking=True)]
        return self.head(self.text.norm(picked))

    def _layer(self, index: int, layer: Any, hidden: Any, cos: Any, sin: Any, first: int) -> Any:
        import torch

        attn = layer.self_attn
        rows, width, _ = hidden.shape
        residual = hidden
        x = layer.input_layernorm(hidden)
        shape = (rows, width, -1, attn.head_dim)
        q = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        self.cache.keys[index][first : first + rows, :, :width] = k
        self.cache.values[index][first : first + rows, :, :width] = v
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=attn.scaling, enable_gqa=True
        )
        hidden = residual + attn.o_proj(out.transpose(1, 2).reshape(rows, width, -1))
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))
