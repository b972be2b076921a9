"""Qwen's step decode path (issue 43) against the SDK's `generate`, on the tiny checkpoint:
token for token alone, and in mixed batches where rows join and leave mid-decode; a row
whose caller has gone leaves at the next step; a row too long for the static cache is
decoded alone; the scheduler hands waiting jobs to the running rows, most urgent first."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from qwen3_asr_server.engines.base import JobCancelledError, TranscribeRequest, TranscribeResult
from qwen3_asr_server.engines.qwen.engine import QwenEngine
from qwen3_asr_server.engines.qwen.steps import bucket
from qwen3_asr_server.runtime.scheduler import (
    BATCH,
    PARTIAL,
    REALTIME,
    BatchSpec,
    PriorityScheduler,
)
from speech import sentences
from streaming_client import load

MAX_NEW = 80  # budgets 32 + 12 s per second of audio: rows of different lengths end apart


def engine(tiny_qwen_dir: Path, decode: str, **options: object) -> QwenEngine:
    e = QwenEngine(str(tiny_qwen_dir), device="cpu", max_new_tokens=MAX_NEW, decode=decode,
                   **options)  # type: ignore[arg-type]  # fmt: skip
    e.load()
    return e


@pytest.fixture(scope="module")
def generate(tiny_qwen_dir: Path) -> Iterator[QwenEngine]:
    e = engine(tiny_qwen_dir, "generate")
    yield e
    e.unload()


@pytest.fixture(scope="module")
def steps(tiny_qwen_dir: Path) -> Iterator[QwenEngine]:
    e = engine(tiny_qwen_dir, "steps", rows=3, kv_tokens=1024)
    yield e
    e.unload()


def clips() -> list[np.ndarray]:
    return [load(name) for name in sorted(sentences())[:4]]


def requests() -> list[TranscribeRequest]:
    """Real speech of several lengths, with every decoding option a row can carry."""
    clips_ = clips()
    return [
        TranscribeRequest(audio=clips_[0], logprobs=True),
        TranscribeRequest(audio=clips_[1][:3200]),  # 0.2 s: padded, the shortest budget
        TranscribeRequest(audio=clips_[2], language="en"),
        TranscribeRequest(audio=clips_[3][:16000], languages=("en", "de"), logprobs=True),
        TranscribeRequest(audio=clips_[0][:24000], prompt="Names: Ada.", keywords=("Qwen",)),
        TranscribeRequest(audio=np.concatenate([clips_[1], clips_[2]])),
        TranscribeRequest(audio=clips_[3][:8000], language="de"),
    ]


def same(a: TranscribeResult, b: TranscribeResult) -> None:
    assert (a.text, a.language, a.usage) == (b.text, b.language, b.usage)
    assert (a.logprobs is None) == (b.logprobs is None)
    for x, y in zip(a.logprobs or [], b.logprobs or [], strict=True):
        assert x.token == y.token and math.isclose(x.logprob, y.logprob, abs_tol=1e-4)


def test_each_row_alone_equals_generate(generate: QwenEngine, steps: QwenEngine) -> None:
    for request in requests():
        same(steps.transcribe(request), generate.transcribe(request))


class Recorder:
    """A RowSource that hands rows out `per_take` at a time and logs what happened."""

    def __init__(self, items: list[TranscribeRequest], per_take: int = 99) -> None:
        self.waiting = list(enumerate(items))
        self.per_take = per_take
        self.steps = 0
        self.joined: dict[int, int] = {}  # row -> the step count when it joined
        self.results: dict[int, TranscribeResult | Exception] = {}
        self.rows_per_step: list[int] = []
        self.gone_after: dict[int, int] = {}  # row -> leaves once this many steps ran

    def take(self, free: int) -> list[tuple[object, TranscribeRequest]]:
        taken = self.waiting[: min(free, self.per_take)]
        self.waiting = self.waiting[len(taken) :]
        for handle, _ in taken:
            self.joined[handle] = self.steps
        return list(taken)

    def gone(self, handle: object) -> bool:
        assert isinstance(handle, int)
        return handle in self.gone_after and self.steps >= self.gone_after[handle]

    def done(
        self, handle: object, result: TranscribeResult | None, error: Exception | None
    ) -> None:
        assert isinstance(handle, int)
        self.results[handle] = error if error is not None else result  # type: ignore[assignment]

    def stepped(self, rows: int) -> None:
        self.steps += 1
        self.rows_per_step.append(rows)


def test_rows_that_join_and_leave_mid_decode_equal_alone(
    generate: QwenEngine, steps: QwenEngine
) -> None:
    items = requests()
    source = Recorder(items, per_take=1)  # one row at a time: each joins a running decode
    steps.decode_rows(source)
    assert sorted(source.results) == list(range(len(items)))
    late = [h for h, at in source.joined.items() if at > 0]
    assert len(late) >= len(items) - 1, source.joined  # joined while others were decoding
    assert max(source.rows_per_step) == 3 and min(source.rows_per_step) == 1
    for handle, request in enumerate(items):
        result = source.results[handle]
        assert isinstance(result, TranscribeResult)
        same(result, generate.transcribe(request))


def test_rows_taken_together_are_prefilled_in_padded_forwards_and_equal_alone(
    generate: QwenEngine, tiny_qwen_dir: Path
) -> None:
    """Seven rows of different lengths and options taken at once: a left-padded prefill
    forward per group of similar lengths (0.2 to 1.5 s; 3 to 6 s), each row's keys and
    values copied past its padding. Each equals `generate` alone (the padding changes
    nothing a row sees)."""
    wide = engine(tiny_qwen_dir, "steps", rows=8)
    assert wide._decoder is not None
    forwards: list[int] = []
    fill = wide._decoder._fill
    wide._decoder._fill = lambda rows, inputs=None: (
        forwards.append(len(rows)),
        fill(rows, inputs),
    )[1]  # type: ignore[method-assign]
    try:
        items = requests()
        results = wide.transcribe_batch(items)
    finally:
        wide.unload()
    assert sorted(forwards) == [3, 4]
    for result, request in zip(results, items, strict=True):
        same(result, generate.transcribe(request))


def test_a_row_whose_caller_left_leaves_at_the_next_step(steps: QwenEngine) -> None:
    items = requests()[:3]
    alone = [steps.transcribe(r) for r in items]
    source = Recorder(items)
    source.gone_after[0] = 5
    steps.decode_rows(source)
    assert isinstance(source.results[0], JobCancelledError)
    assert source.rows_per_step[5] == 2  # it stepped 5 times, then the rest went on without it
    for handle in (1, 2):
        result = source.results[handle]
        assert isinstance(result, TranscribeResult)
        same(result, alone[handle])


def test_a_row_too_long_for_the_cache_is_decoded_alone(
    tiny_qwen_dir: Path, generate: QwenEngine
) -> None:
    small = engine(tiny_qwen_dir, "steps", rows=2, kv_tokens=256)
    try:
        long = TranscribeRequest(audio=np.concatenate(clips()))
        short = requests()[1]
        source = Recorder([long, short])
        small.decode_rows(source)
        for handle, request in enumerate((long, short)):
            result = source.results[handle]
            assert isinstance(result, TranscribeResult)
            same(result, generate.transcribe(request))
        assert source.rows_per_step and max(source.rows_per_step) == 1  # only the short one
    finally:
        small.unload()


def test_a_too_long_row_that_fails_fails_alone(tiny_qwen_dir: Path, generate: QwenEngine) -> None:
    """A row too long for the cache is decoded by `generate`; when that fails (here: its
    caller has gone), only that row hears it. The row prefilled beside it decodes on."""
    small = engine(tiny_qwen_dir, "steps", rows=2, kv_tokens=256)
    try:
        long = TranscribeRequest(audio=np.concatenate(clips()))
        short = requests()[1]
        source = Recorder([long, short])
        source.gone_after[0] = 0  # the long row's caller left before it started
        small.decode_rows(source)
        assert isinstance(source.results[0], JobCancelledError), source.results
        result = source.results[1]
        assert isinstance(result, TranscribeResult), result
        same(result, generate.transcribe(short))
    finally:
        small.unload()


class Answers(Recorder):
    """A Recorder that keeps every answer each row got (a row is answered once)."""

    def __init__(self, items: list[TranscribeRequest]) -> None:
        super().__init__(items)
        self.answers: dict[int, list[TranscribeResult | Exception]] = {}

    def done(
        self, handle: object, result: TranscribeResult | None, error: Exception | None
    ) -> None:
        super().done(handle, result, error)
        assert isinstance(handle, int)
        self.answers.setdefault(handle, []).append(self.results[handle])


def test_a_failed_prefill_leaves_no_row_behind(steps: QwenEngine) -> None:
    """The prefill fails after the first rows taken are in the cache (the forward's end
    failed, as a CUDA error would): every row taken hears that error, once, and none is
    left in the cache to decode on; the next call decodes as before the failure."""
    items = requests()[:2]  # two lengths: two prefill forwards
    before = [steps.transcribe(r) for r in items]
    decoder = steps._decoder
    assert decoder is not None
    prefill = decoder.prefill

    def fails(rows):  # type: ignore[no-untyped-def]
        prefill(rows)  # the rows are in the cache ...
        raise RuntimeError("CUDA error: an illegal memory access")  # ... and then this

    decoder.prefill = fails  # type: ignore[method-assign]
    try:
        source = Answers(items)
        steps.decode_rows(source)
    finally:
        del decoder.prefill
    assert decoder.rows == []
    for handle in range(len(items)):
        answers = source.answers[handle]
        assert len(answers) == 1 and isinstance(answers[0], RuntimeError), answers
    for request, result in zip(items, before, strict=True):
        same(steps.transcribe(request), result)


def test_buckets() -> None:
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9, 31, 33)] == [1, 2, 4, 8, 8, 16, 32, 64]


async def test_the_scheduler_hands_waiting_jobs_to_running_rows(steps: QwenEngine) -> None:
    """Uploads start a step loop; a final and a partial submitted while it runs join it
    before the waiting uploads, and every job's answer equals its decode alone."""
    items = requests()
    alone = [steps.transcribe(r) for r in items]
    batches: list[tuple[int, int]] = []
    sched = PriorityScheduler(
        max_queue=16, max_batch=3, on_batch=lambda p, n: batches.append((p, n))
    )
    sched.start()
    try:
        decoder = steps._decoder
        assert decoder is not None
        joined: dict[str, int] = {}  # job -> rows in flight when the loop took it

        def spec(request: TranscribeRequest, name: str = "") -> BatchSpec:
            def taken() -> TranscribeRequest:  # (called as the loop takes the job)
                joined[name] = len(decoder.rows)
                return request

            return BatchSpec("qwen", taken if name else request, lambda rs: [], steps.decode_rows)

        def never(request: TranscribeRequest):  # type: ignore[no-untyped-def]
            raise AssertionError("a stepping engine's job ran on its own")

        uploads = [
            asyncio.create_task(sched.submit(never, priority=BATCH, batch=spec(r), admitted=True))
            for r in items[:5]
        ]
        while not batches:  # the loop has started (its first step is done)
            await asyncio.sleep(0.005)
        final = sched.submit(never, priority=REALTIME, batch=spec(items[5], "final"), admitted=True)
        partial = sched.submit(never, priority=PARTIAL, batch=spec(items[6], "partial"))
        results = await asyncio.gather(*uploads, final, partial)
    finally:
        sched.stop()
    for result, expected in zip(results, alone, strict=True):
        same(result, expected)
    # both joined running rows (a partial in flight beside the final is not seen in
    # `batches`, which names each step's most urgent row only)
    assert joined["final"] > 0 and joined["partial"] > 0, joined
    assert REALTIME in [p for p, _ in batches]
    assert max(n for _, n in batches) == 3


def cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not cuda(), reason="needs a CUDA GPU; none on this machine")
def test_cuda_graphs_decode_as_the_eager_step_and_free_everything(tiny_qwen_dir: Path) -> None:
    import torch

    results = {}
    # float32: on the H100 in bf16, a graph (rows padded to its bucket) and the eager step
    # differed in the last bits, enough to flip a near tie of the random weights' argmax
    for graphs in ("auto", "off"):
        e = QwenEngine(str(tiny_qwen_dir), device="cuda", max_new_tokens=MAX_NEW, rows=3,
                       graphs=graphs, dtype="float32")  # fmt: skip
        e.load()
        source = Recorder(requests(), per_take=1)
        e.decode_rows(source)
        results[graphs] = [source.results[h] for h in sorted(source.results)]
        assert (graphs == "auto") == bool(e._decoder and e._decoder.stepper.graphs)
        e.unload()
        assert torch.cuda.memory_allocated() == 0
    for a, b in zip(results["auto"], results["off"], strict=True):
        assert isinstance(a, TranscribeResult) and isinstance(b, TranscribeResult)
        assert a.text == b.text


def test_a_failing_caller_check_leaves_the_cache_empty(steps: QwenEngine) -> None:
    def explode() -> bool:
        raise RuntimeError("failure mid-decode")

    before = steps.transcribe(requests()[1])
    with pytest.raises(RuntimeError):
        steps.transcribe(requests()[0], explode)
    assert steps._decoder is not None and steps._decoder.rows == []
    same(steps.transcribe(requests()[1]), before)  # as before the failure


def test_prefill_groups_keep_lengths_alike_and_forwards_bounded() -> None:
    from qwen3_asr_server.engines.qwen.generate import PREFILL_SAMPLES, prefill_groups

    second = 16000
    lengths = [30 * second, 2 * second, 3 * second, 29 * second, second // 2]
    groups = prefill_groups(lengths)
    assert sorted(map(sorted, groups)) == [[0, 3], [1, 4], [2]]  # a 0.5 s row never beside 30 s
    many = [30 * second] * 20
    chunks = prefill_groups(many)
    assert sum(map(len, chunks)) == 20
    assert all(len(c) * 30 * second <= PREFILL_SAMPLES for c in chunks) and len(chunks) == 3


class Gated(Recorder):
    """Row 1's preparation waits until row 0 has stepped `steps` times without it."""

    def __init__(self, items: list[TranscribeRequest], steps: int) -> None:
        super().__init__(items, per_take=1)
        self.gate = threading.Event()
        self.wanted = steps
        self.taken_at: dict[int, int] = {}

    def take(self, free: int) -> list[tuple[object, TranscribeRequest]]:
        taken = super().take(free)
        for handle, _ in taken:
            self.taken_at[int(handle)] = self.steps  # type: ignore[call-overload]
        return taken

    def stepped(self, rows: int) -> None:
        super().stepped(rows)
        if 1 in self.taken_at and self.steps - self.taken_at[1] >= self.wanted:
            self.gate.set()


def test_rows_in_flight_keep_stepping_while_new_rows_are_prepared(
    generate: QwenEngine, steps: QwenEngine
) -> None:
    """(Issue 50) a row's prompt and log-mel are prepared off the inference thread: the
    rows in flight step meanwhile, and it joins once ready, decoding as it would alone."""
    items = requests()[:2]
    items[0] = TranscribeRequest(audio=np.concatenate([clips()[0]] * 3))  # a long budget
    source = Gated(items, steps=3)
    preparer = steps._preparer
    assert preparer is not None
    one = preparer.one

    def gated(handle: object, request: TranscribeRequest):  # type: ignore[no-untyped-def]
        if handle == 1:
            assert source.gate.wait(timeout=60), "the rows in flight did not step meanwhile"
        return one(handle, request)

    decoder = steps._decoder
    assert decoder is not None
    prefill, prefilled_at = decoder.prefill, {}

    def noting(rows):  # type: ignore[no-untyped-def]
        prefilled_at.update({r.handle: source.steps for r in rows})
        return prefill(rows)

    preparer.one = gated  # type: ignore[method-assign]
    decoder.prefill = noting  # type: ignore[method-assign]
    try:
        steps.decode_rows(source)
    finally:
        del preparer.one, decoder.prefill
    assert source.gate.is_set()
    assert prefilled_at[1] - source.taken_at[1] >= 3, (source.taken_at, prefilled_at)
    for handle, request in enumerate(items):
        result = source.results[handle]
        assert isinstance(result, TranscribeResult), result
        same(result, generate.transcribe(request))


def test_a_row_whose_caller_left_while_it_was_prepared_is_not_prefilled(
    steps: QwenEngine,
) -> None:
    source = Recorder(requests()[:2])
    source.gone_after = {1: 0}  # gone before its first step
    decoder = steps._decoder
    assert decoder is not None
    prefilled: list[object] = []
    prefill = decoder.prefill

    def counting(rows):  # type: ignore[no-untyped-def]
        prefilled.extend(r.handle for r in rows)
        return prefill(rows)

    decoder.prefill = counting  # type: ignore[method-assign]
    try:
        steps.decode_rows(source)
    finally:
        del decoder.prefill
    assert isinstance(source.results[1], JobCancelledError)
    assert isinstance(source.results[0], TranscribeResult)
    assert prefilled == [0]
