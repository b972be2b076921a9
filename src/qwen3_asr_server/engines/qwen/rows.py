"""The rows of our Qwen3-ASR decode loop (`steps.py`): a request's prompt, its prefill
into a cache slot, its tokens as the steps produce them, and when it ends (its end token,
its budget, or its caller gone).

The steps keep every running row's next token on the device; the host reads the tokens
back every `sync_every` steps (1 on CPU; more on CUDA, where each read is a
synchronisation), and rows join and leave only then. A row that ended a few steps before a
read has its extra tokens dropped. Rows restricted to candidate language headers are read
every step while the header is open.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from loguru import logger

from ...audio.pcm import SAMPLE_RATE
from ...text import language_name
from ..base import TranscribeRequest
from .encoder import AudioEncoder
from .guard import EOS_IDS, RowSpec, restrict
from .prefill import Prefiller, Prompts
from .steps import BUCKETS, Cache, CapturedStep, Shape, Stepper, bucket, kv_bucket, kv_buckets
from .tokens import RowRecord

PAD_TO_SAMPLES = SAMPLE_RATE // 2  # shorter clips are zero-padded to 0.5 s
PREFILL_SAMPLES = 256 * SAMPLE_RATE  # padded audio per prefill: bounds its activations


@dataclass
class Row:
    handle: object  # the caller's name for it
    request: TranscribeRequest
    spec: RowSpec
    forced: str | None  # the language named in the prompt (the answer is then text only)
    record: RowRecord = field(default_factory=RowRecord)
    length: int = 0  # tokens in its cache slot
    next: int = 0  # the token it feeds next
    ended: bool = False
    hit: bool = False  # stopped at its budget without an end token
    seconds: float = 0.0  # engine time: its prefill, and its share of each step
    prompts: Prompts | None = None  # its tokens and features (`prepare.Preparer`)

    def take(self, token: int, logprob: float | None) -> None:
        """A token the model chose for this row (ignored once it has ended)."""
        if self.ended:
            return
        self.record.generated.append(token)
        if logprob is not None:
            self.record.logprobs.append(logprob)
        self.next = token
        if token in EOS_IDS:
            self.ended = True
        elif len(self.record.generated) >= self.spec.budget:
            self.ended = self.hit = True

    @property
    def header_open(self) -> bool:
        done = len(self.record.generated)
        return bool(self.spec.headers) and any(len(h) > done for h in self.spec.headers or [])


class Decoder:
    """The static cache, the step, and the rows in flight (slot i holds rows[i])."""

    def __init__(
        self, sdk: Any, slots: int, length: int, graphs: bool, sync_every: int = 1
    ) -> None:
        thinker = sdk.model.thinker
        config = thinker.config.text_config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // (
            config.num_attention_heads
        )
        shape = Shape(config.num_hidden_layers, config.num_key_value_heads, head_dim)
        self.sdk = sdk
        self.thinker = thinker
        self.device = thinker.device
        self.slots = bucket(slots) if graphs else slots
        self.cache = Cache(shape, self.slots, length, self.device, thinker.dtype)
        self.stepper = Stepper(thinker, self.cache)
        self.encoder = AudioEncoder(thinker.audio_tower, gpu=graphs)
        self.prefiller = Prefiller(thinker, self.cache, self.encoder, buckets=graphs)
        self.graphs = graphs
        self.sync_every = max(1, sync_every)
        self.rows: list[Row] = []
        if graphs:  # captured now, with no row in flight (a capture writes into the cache)
            import torch

            # One side stream for every capture: each stream gets its own cuBLAS workspace
            # (32 MiB on Hopper), which outlives the graphs until the engine's unload.
            stream = torch.cuda.Stream()
            with torch.inference_mode():
                for size in (b for b in BUCKETS if b <= self.slots):
                    for kv in kv_buckets(length):
                        step = CapturedStep(self.stepper, size, kv, stream)
                        self.stepper.graphs[size, kv] = step

    def warm(self, seconds: tuple[int, ...] = (2, 10, 30)) -> None:
        """Prefill 1, 2, 4 ... rows of silence of each length (nothing is kept; at most
        PREFILL_SAMPLES at once, as serving does), so that
        no caller pays for the first call of a shape: on CUDA the encoder's chunk and
        window counts and the prompt widths come in buckets, and these cover them."""
        import torch

        started = time.perf_counter()
        prompt = self.sdk._build_text_prompt("", None)
        with torch.inference_mode():
            for rows in (b for b in BUCKETS if b <= self.slots):
                for length in seconds:
                    if rows * length * SAMPLE_RATE > PREFILL_SAMPLES:
                        continue  # never one prefill (`prefill_groups` keeps under it)
                    audio = np.zeros(length * SAMPLE_RATE, dtype=np.float32)
                    inputs = self.sdk.processor(
                        text=[prompt] * rows, audio=[audio] * rows, return_tensors="pt"
                    )
                    prompts = Prompts.of(inputs)
                    if max(prompts.lengths()) < self.cache.length:
                        self.prefiller(prompts, 0)
        logger.info("prefill shapes warmed in {:.1f} s", time.perf_counter() - started)

    @property
    def free(self) -> int:
        return self.slots - len(self.rows)

    def fits(self, row: Row, prompt_tokens: int) -> bool:
        return prompt_tokens + row.spec.budget + self.sync_every <= self.cache.length

    def prefill(self, rows: list[Row]) -> list[bool]:
        """Prefill the rows' prepared prompts together (`prefill.Prefiller`: each row's
        positions, attention and audio windows are its own, so its first token is what it
        would be alone), keep each row's keys and values in the next free slot, and choose
        its first token. False for a row that does not fit in the cache (not prefilled;
        the others are, without it)."""
        fits = []
        for row in rows:
            assert row.prompts is not None, "a row is prepared before its prefill"
            ids = row.prompts.ids[0]
            row.record.input_tokens = len(ids)
            row.record.audio_tokens = int((ids == self.prefiller.audio_token).sum())
            fits.append(self.fits(row, len(ids)))
        kept = [row for row, ok in zip(rows, fits, strict=True) if ok]
        if kept:  # (rarely not all: a prompt too long for the cache is left out)
            self._fill(kept, Prompts.join([r.prompts for r in kept if r.prompts is not None]))
        return fits

    def _fill(self, rows: list[Row], prompts: Prompts) -> None:
        import torch

        started = time.perf_counter()
        with torch.inference_mode():
            logits = self.prefiller(prompts, len(self.rows))
        for row, length in zip(rows, prompts.lengths(), strict=True):
            row.length = length
            self.rows.append(row)
        self._choose(rows, logits)
        share = (time.perf_counter() - started) / len(rows)
        for row in rows:
            row.seconds += share

    def step(self) -> None:
        """`sync_every` steps (one while a header is restricted); tokens read back once."""
        import torch

        rows = self.rows
        started = time.perf_counter()
        restricted = any(r.header_open for r in rows)
        steps = 1 if restricted else self.sync_every
        device = self.device
        tokens = torch.tensor([r.next for r in rows], dtype=torch.long, device=device)
        positions = torch.tensor([r.length for r in rows], dtype=torch.long, device=device)
        # the positions the last step attends to (never past the cache: `fits` keeps room)
        reads = min(max(r.length for r in rows) + steps, self.cache.length)
        chosen, scores = [], []
        with torch.inference_mode():
            for _ in range(steps):
                logits = self._logits(tokens, positions, reads)
                if restricted:
                    self._choose(rows, logits)
                    break
                tokens = logits.argmax(-1)
                chosen.append(tokens)
                if any(r.spec.logprobs for r in rows):
                    logp = torch.log_softmax(logits.float(), dim=-1)
                    scores.append(logp.gather(1, tokens[:, None])[:, 0])
                positions = positions + 1
        if chosen:
            picked = torch.stack(chosen, 1).tolist()
            lps = torch.stack(scores, 1).tolist() if scores else None
            for i, row in enumerate(rows):
                for s, token in enumerate(picked[i]):
                    row.take(token, lps[i][s] if lps and row.spec.logprobs else None)
        share = (time.perf_counter() - started) / len(rows)
        for row in rows:
            row.length += steps
            row.seconds += share

    def _logits(self, tokens: Any, positions: Any, reads: int) -> Any:
        """`reads`: the positions the step may attend to (the host knows each row's length:
        nothing is read back for it)."""
        rows = tokens.shape[0]
        if not self.graphs:
            return self.stepper.run(tokens, positions, reads)
        kv = kv_bucket(reads, self.cache.length)
        out: Any = self.stepper.graphs[bucket(rows), kv](tokens, positions)
        return out

    def _choose(self, rows: list[Row], logits: Any) -> None:
        """One token per row from `logits` [rows, vocab]: greedy, read back once for all
        rows, with its log probability; within the candidate headers (on the host, row by
        row) for a row whose header is open."""
        import torch

        scores = logits.float()
        tokens = scores.argmax(-1)
        logp = torch.log_softmax(scores, dim=-1).gather(1, tokens[:, None])[:, 0]
        picked = torch.stack([tokens.to(logp.dtype), logp]).tolist()  # exact below 2**24
        for i, row in enumerate(rows):
            if row.header_open:
                self._choose_header(row, scores[i : i + 1])
                continue
            row.take(int(picked[0][i]), picked[1][i] if row.spec.logprobs else None)

    @staticmethod
    def _choose_header(row: Row, scores: Any) -> None:
        import torch

        done = row.record.generated
        ids = torch.tensor([done], dtype=torch.long).reshape(1, len(done))
        scores = restrict(ids, scores.clone(), [row.spec])
        token = int(scores.argmax(-1))
        logprob = float(torch.log_softmax(scores, dim=-1)[0, token]) if row.spec.logprobs else None
        row.take(token, logprob)

    def leave(self, ended: Callable[[Row], bool]) -> list[Row]:
        """Take out the rows for which `ended(row)`: rows that stay beyond the new count
        move into the slots freed below it (the fewest moves: none when the last rows or
        all rows leave)."""
        out = [ended(r) for r in self.rows]
        gone = [r for r, o in zip(self.rows, out, strict=True) if o]
        count = len(self.rows) - len(gone)
        holes = [i for i in range(count) if out[i]]
        movers = [i for i in range(count, len(self.rows)) if not out[i]]
        for hole, mover in zip(holes, movers, strict=True):
            self.cache.move(mover, hole, self.rows[mover].length)
            self.rows[hole] = self.rows[mover]
        del self.rows[count:]
        return gone


def prompt_for(sdk: Any, request: TranscribeRequest) -> tuple[str, str | None]:
    """The SDK's chat prompt for a request, and the language it forces (if any)."""
    forced = language_name(request.language)
    text: str = sdk._build_text_prompt(context(request.prompt, request.keywords), forced)
    return text, forced


def context(prompt: str | None, keywords: tuple[str, ...]) -> str:
    """The SDK's `context` (the chat's system turn): the prompt, then the keywords as one
    comma-separated line. Qwen3-ASR reads it as background that biases recognition."""
    return "\n".join(part for part in (prompt or "", ", ".join(keywords)) if part)


def padded(audio: np.ndarray) -> np.ndarray:
    """Zero-pad clips under 0.5 s: the feature extractor raises on ≤ 200 samples, and short
    unpadded clips often decode empty (the transformers port pads the same way). The
    response keeps the real duration."""
    if len(audio) >= PAD_TO_SAMPLES:
        return audio
    out = np.zeros(PAD_TO_SAMPLES, dtype=np.float32)
    out[: len(audio)] = audio
    return out
