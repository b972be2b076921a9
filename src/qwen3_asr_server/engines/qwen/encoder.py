"""Our own Qwen3-ASR audio encoder over the checkpoint's modules (issue 50), the way
`steps.Stepper` runs the text model: every row of a prefill at once, in its 8 s windows.

The checkpoint's encoder cuts a row's log-mel frames into 1 s chunks (`n_window * 2`
frames), runs each chunk through three strided convolutions, adds positions that restart
in every chunk, and attends within windows of `n_window_infer` frames (8 s: 8 chunks). The
SDK's own forward works one row at a time, reads GPU values on the host inside, and under
SDPA attends across the whole row (it passes no mask; only flash-attention's varlen path
reads its windows). Here:
- the chunks of all rows go through one convolution;
- the windows of all rows are packed as one batch, one attention call per layer, with a
  key-padding mask for the short tail windows;
- every length and index is computed on the host from the feature lengths before anything
  is sent to the device; nothing is read back.

A row's output equals the SDK's forward on that row alone with its windows applied (what
its flash-attention path computes; `reference` in the tests), including its one quirk: a
row's tail chunk is zero-padded to a whole chunk before the convolutions when the row has
a whole chunk, and not padded when the row is shorter than one chunk (then the padding's
activations are masked out here, so that batch partners change nothing). torch is imported
only inside calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

CPU_CONV_ROWS = 16


def conv_length(frames: int) -> int:
    """Positions after one convolution of kernel 3, stride 2, padding 1."""
    return (frames - 1) // 2 + 1


def tokens_for(frames: int, chunk: int = 100) -> int:
    """Encoder outputs (audio tokens) for a row of `frames` log-mel frames."""
    whole, tail = divmod(frames, chunk)
    per_chunk = conv_length(conv_length(conv_length(chunk)))
    return whole * per_chunk + (conv_length(conv_length(conv_length(tail))) if tail else 0)


def bucket_up(n: int) -> int:
    """The next power of two (shapes the device sees, so that few are ever new)."""
    return 1 << max(0, n - 1).bit_length()


@dataclass
class Plan:
    """Where every chunk, window and output of a prefill lives (host values only)."""

    chunks: list[tuple[int, int, int]]  # (row, first frame, frames) per chunk
    valid: list[tuple[int, int]]  # per chunk: valid positions after conv1, conv2 (masking)
    window_of: list[list[int]]  # per window: its chunks
    window_tokens: list[int]  # per window: its valid tokens
    gather: list[int]  # per packed window position: index into the chunk outputs (or pad)
    keep: list[int]  # per output token: index into the packed windows
    per_row: list[int]  # output tokens per row


class AudioEncoder:
    """The checkpoint's audio tower (`thinker.audio_tower`), batched and windowed."""

    def __init__(self, tower: Any, gpu: bool = False) -> None:
        self.tower = tower
        self.chunk = int(tower.n_window) * 2  # log-mel frames per chunk (1 s)
        self.window_chunks = max(1, int(tower.n_window_infer) // self.chunk)  # 8 s
        self.per_chunk = conv_length(conv_length(conv_length(self.chunk)))
        self.window = self.per_chunk * self.window_chunks  # tokens per window
        self.buckets = gpu  # chunk and window counts padded to powers of two: few shapes
        # chunks per convolution call: the checkpoint's bound on a GPU; on a CPU small
        # calls stay in cache (measured on 320 tiny chunks: 139 ms in one, 36 ms by 16)
        self.conv_rows = int(getattr(tower, "conv_chunksize", 0) or 500) if gpu else CPU_CONV_ROWS

    def plan(self, frames: list[int]) -> Plan:
        """The layout of rows of `frames` log-mel frames each, on the host."""
        chunks: list[tuple[int, int, int]] = []
        valid: list[tuple[int, int]] = []
        window_of: list[list[int]] = []
        window_tokens: list[int] = []
        per_row: list[int] = []
        for row, length in enumerate(frames):
            ids: list[int] = []
            for start in range(0, length, self.chunk):
                size = min(self.chunk, length - start)
                ids.append(len(chunks))
                chunks.append((row, start, size))
                if length < self.chunk:  # alone the SDK would not pad it: mask the padding
                    valid.append((conv_length(size), conv_length(conv_length(size))))
                else:
                    valid.append((self.chunk, self.chunk))
            tokens = 0
            for w in range(0, len(ids), self.window_chunks):
                members = ids[w : w + self.window_chunks]
                window_of.append(members)
                window_tokens.append(sum(self._chunk_tokens(chunks[c][2]) for c in members))
                tokens += window_tokens[-1]
            per_row.append(tokens)
        pad = len(chunks) * self.per_chunk  # the index of the zero row after the chunks
        gather: list[int] = []
        keep: list[int] = []
        for w, members in enumerate(window_of):
            slots: list[int] = []
            for c in members:
                n = self._chunk_tokens(chunks[c][2])
                slots += range(c * self.per_chunk, c * self.per_chunk + n)
            keep += range(w * self.window, w * self.window + len(slots))
            gather += slots + [pad] * (self.window - len(slots))
        return Plan(chunks, valid, window_of, window_tokens, gather, keep, per_row)

    def _chunk_tokens(self, size: int) -> int:
        return conv_length(conv_length(conv_length(size)))

    def __call__(self, features: Any, frames: list[int]) -> Any:
        """Encoder outputs [sum of tokens, output_dim] of rows whose log-mel `features`
        [rows, mel, T] (numpy, or a tensor on the host or the device) hold `frames[i]`
        valid frames each, rows in order (as the SDK's `get_audio_features` returns)."""
        import torch

        tower = self.tower
        plan = self.plan(frames)
        device, dtype = tower.conv2d1.weight.device, tower.conv2d1.weight.dtype
        n_chunks = len(plan.chunks)
        n_padded = bucket_up(n_chunks) if self.buckets else n_chunks
        source = features if isinstance(features, np.ndarray) else features.float().cpu().numpy()
        host = np.zeros((n_padded, 1, source.shape[1], self.chunk), dtype=np.float32)
        for c, (row, start, size) in enumerate(plan.chunks):
            host[c, 0, :, :size] = source[row, :, start : start + size]
        x = torch.from_numpy(host).to(device, dtype, non_blocking=True)
        masks = self._conv_masks(plan, n_padded, device, dtype)
        outs = []
        step = self.conv_rows
        for part in range(0, n_padded, step):
            y = torch.nn.functional.gelu(tower.conv2d1(x[part : part + step]))
            if masks is not None:
                y = y * masks[0][part : part + step, :, :, : y.shape[-1]]
            y = torch.nn.functional.gelu(tower.conv2d2(y))
            if masks is not None:
                y = y * masks[1][part : part + step, :, :, : y.shape[-1]]
            outs.append(torch.nn.functional.gelu(tower.conv2d3(y)))
        y = torch.cat(outs)  # [chunks, channels, freq, per_chunk]
        b, c, f, t = y.shape
        y = tower.conv_out(y.permute(0, 3, 1, 2).reshape(b, t, c * f))
        y = y + tower.positional_embedding.positional_embedding[:t].to(y.dtype)[None]
        return self._attend(y.reshape(b * t, -1), plan, device)

    def _conv_masks(self, plan: Plan, rows: int, device: Any, dtype: Any) -> Any:
        """Zero the convolutions' outputs past a short row's own length (None: no row is
        short, nothing to mask)."""
        import torch

        if all(v == (self.chunk, self.chunk) for v in plan.valid):
            return None
        masks = []
        for k, width in enumerate((conv_length(self.chunk), conv_length(conv_length(self.chunk)))):
            m = np.ones((rows, 1, 1, width), dtype=np.float32)
            for c, v in enumerate(plan.valid):
                m[c, :, :, v[k] :] = 0
            masks.append(torch.from_numpy(m).to(device, dtype, non_blocking=True))
        return masks

    def _attend(self, flat: Any, plan: Plan, device: Any) -> Any:
        import torch

        tower = self.tower
        windows = len(plan.window_of)
        n_windows = bucket_up(windows) if self.buckets else windows
        pad_rows = (n_windows - windows) * self.window
        zero = torch.zeros(1, flat.shape[1], dtype=flat.dtype, device=device)
        source = torch.cat([flat, zero])
        pad = flat.shape[0]
        index = torch.tensor(plan.gather + [pad] * pad_rows, dtype=torch.long)
        hidden = source[index.to(device, non_blocking=True)].view(n_windows, self.window, -1)
        key_ok = np.zeros((n_windows, self.window), dtype=bool)
        for w, n in enumerate(plan.window_tokens):
            key_ok[w, :n] = True
        key_ok[windows:, 0] = True  # padding windows attend somewhere (no NaN)
        mask = torch.from_numpy(key_ok).to(device, non_blocking=True)[:, None, None, :]
        for layer in tower.layers:
            hidden = self._layer(layer, hidden, mask)
        keep = torch.tensor(plan.keep, dtype=torch.long).to(device, non_blocking=True)
        out = hidden.reshape(n_windows * self.window, -1)[keep]
        out = tower.proj2(tower.act(tower.proj1(tower.ln_post(out))))
        return out

    @staticmethod
    def _layer(layer: Any, hidden: Any, mask: Any) -> Any:
        import torch

        attn = layer.self_attn
        windows, length, dim = hidden.shape
        residual = hidden
        x = layer.self_attn_layer_norm(hidden)
        shape = (windows, length, attn.num_heads, attn.head_dim)
        q = attn.q_proj(x).view(shape).transpose(1, 2)
        k = attn.k_proj(x).view(shape).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=attn.scaling
        )
        hidden = residual + attn.out_proj(out.transpose(1, 2).reshape(windows, length, dim))
        residual = hidden
        x = layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(hidden))))
        hidden = residual + x
        if hidden.dtype == torch.float16:  # as the checkpoint's layer does
            limit = torch.finfo(hidden.dtype).max - 1000
            hidden = torch.clamp(hidden, min=-limit, max=limit)
        return hidden


def install(thinker: Any, gpu: bool = False) -> AudioEncoder:
    """Make the thinker's own forward (the SDK's `generate`, the aligner) use the batched,
    windowed encoder instead of the SDK's row-by-row one: both decode paths then serve the
    same model. The lengths are read from the feature mask once per call."""
    encoder = AudioEncoder(thinker.audio_tower, gpu)

    def get_audio_features(
        input_features: Any, feature_attention_mask: Any = None, audio_feature_lengths: Any = None
    ) -> Any:
        lengths = (
            feature_attention_mask.sum(1)
            if feature_attention_mask is not None
            else audio_feature_lengths
        )
        return encoder(input_features, [int(n) for n in lengths.tolist()])

    thinker.get_audio_features = get_audio_features
    return encoder
