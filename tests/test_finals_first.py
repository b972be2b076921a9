"""Finals first in a step loop (issue 50): while streams are live, partials and uploads
leave slots free for finals; a final that finds no slot free makes a running partial leave
(its job waits again and is retried with the newest audio), never an upload; arrivals are
gathered into one take. Unit tests of the scheduler: the real step loop
(engines/qwen/loop.py) over a fake decoder stands in for the Qwen engine."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from qwen3_asr_server.engines.qwen.loop import nothing_to_prepare, run_rows
from qwen3_asr_server.runtime.scheduler import (
    BATCH,
    PARTIAL,
    REALTIME,
    BatchSpec,
    PriorityScheduler,
)

SLOTS = 8


@dataclass
class Req:
    label: str
    steps: int | None = None  # None: until its label's prefix is released


@dataclass
class FakeRow:
    handle: object
    req: Req
    stepped: int = 0
    released: bool = False

    @property
    def ended(self) -> bool:
        return self.released or (self.req.steps is not None and self.stepped >= self.req.steps)


class Stepping:
    """A stepping engine: the real step loop over `SLOTS` fake slots. A step takes ~1 ms
    (the engine's own work, not a wait of the test)."""

    def __init__(self, slots: int = SLOTS) -> None:
        self.slots = slots
        self.rows: list[FakeRow] = []
        self.released: set[str] = set()
        self.steps = 0
        self.most = 0  # the most rows in one step
        self.takes: list[list[str]] = []  # the labels of the rows joined together
        self.pace = threading.Event()  # never set

    @property
    def free(self) -> int:
        return self.slots - len(self.rows)

    def running(self) -> set[str]:
        return {row.req.label for row in list(self.rows)}

    def release(self, prefix: str) -> None:
        self.released.add(prefix)

    def decode_rows(self, source: Any) -> None:
        join = lambda joining, _: self._join(joining)  # noqa: E731
        run_rows(self, source, nothing_to_prepare, join, lambda row: row.req.label)  # type: ignore[arg-type]

    def _join(self, joining: list[tuple[object, Req, Any]]) -> list[FakeRow]:
        rows = [FakeRow(handle, req) for handle, req, _ in joining]
        self.rows = self.rows + rows
        self.takes.append([row.req.label for row in rows])
        return rows

    def leave(self, ended: Callable[[FakeRow], bool]) -> list[FakeRow]:
        out = [row for row in self.rows if ended(row)]
        self.rows = [row for row in self.rows if row not in out]
        return out

    def step(self) -> None:
        self.pace.wait(0.001)
        self.most = max(self.most, len(self.rows))
        for row in self.rows:
            row.stepped += 1
            row.released = any(row.req.label.startswith(p) for p in self.released)
        self.steps += 1


def never() -> str:
    raise AssertionError("a stepping engine's job ran on its own")


class Bench:
    def __init__(self, sched: PriorityScheduler, engine: Stepping) -> None:
        self.sched = sched
        self.engine = engine
        self.built: dict[str, int] = {}  # partial -> times its request was built
        self.starts: list[int] = []  # the priority of each job's start (metrics)

    def spec(self, item: Any) -> BatchSpec:
        return BatchSpec("qwen", item, lambda items: [], self.engine.decode_rows)

    def upload(self, label: str, steps: int | None = None) -> asyncio.Task[str]:
        return self._submit(Req(label, steps), BATCH)

    def final(self, label: str, steps: int | None = None) -> asyncio.Task[str]:
        return self._submit(Req(label, steps), REALTIME)

    def partial(self, label: str) -> asyncio.Task[str]:
        def build() -> Req:  # the newest audio, when the job joins
            self.built[label] = self.built.get(label, 0) + 1
            return Req(f"{label}#{self.built[label]}")

        return self._submit(build, PARTIAL)

    def _submit(self, item: Any, priority: int) -> asyncio.Task[str]:
        return asyncio.create_task(
            self.sched.submit(
                never, priority=priority, batch=self.spec(item), admitted=priority != PARTIAL
            )
        )

    async def steps(self, n: int) -> None:
        """Until `n` more steps have run."""
        target = self.engine.steps + n
        await until(lambda: self.engine.steps >= target)


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the condition"
        await asyncio.sleep(0.005)


@pytest.fixture
async def bench() -> AsyncIterator[Bench]:
    starts: list[int] = []
    sched = PriorityScheduler(
        max_queue=64,
        max_batch=SLOTS,
        realtime_quiet=600.0,  # streams stay live for the whole test once one was seen
        on_start=lambda priority, waited: starts.append(priority),
    )
    sched.start()
    b = Bench(sched, Stepping())
    b.starts = starts
    yield b
    b.engine.release("")  # every row ends
    await asyncio.to_thread(sched.stop)


async def test_uploads_leave_a_slot_for_finals_while_streams_are_live(bench: Bench) -> None:
    """Slots 8, streams live: uploads fill 7 slots at most; a final that comes later joins
    at once (at the next step), beside the uploads that still run."""
    assert await bench.final("f0", steps=1) == "f0"  # a stream is live now
    uploads = [bench.upload(f"u{i}") for i in range(10)]
    await until(lambda: len(bench.engine.running()) == 7 and bench.sched.depth == 3)
    await bench.steps(20)
    assert bench.engine.most == 7 and bench.sched.depth == 3
    final = bench.final("F", steps=2)
    assert await asyncio.wait_for(final, 30) == "F"
    assert bench.engine.running() == {f"u{i}" for i in range(7)}  # the uploads still run
    assert not any(u.done() for u in uploads)
    bench.engine.release("u")
    assert await asyncio.gather(*uploads) == [f"u{i}" for i in range(10)]
    await until(lambda: not bench.sched.busy)  # (counted down just after the answer goes)


async def test_uploads_fill_every_slot_while_no_stream_is_live(bench: Bench) -> None:
    uploads = [bench.upload(f"u{i}") for i in range(10)]
    await until(lambda: len(bench.engine.running()) == SLOTS and bench.sched.depth == 2)
    bench.engine.release("u")
    assert await asyncio.gather(*uploads) == [f"u{i}" for i in range(10)]
    assert bench.engine.most == SLOTS


async def test_a_waiting_final_displaces_a_partial_which_is_retried_later(bench: Bench) -> None:
    """Every slot full (two finals, six partials), a third final comes: the youngest
    partial leaves at the next step, the final joins; the partial's job waits again and
    is answered later, with a request built anew from its function, never an error."""
    first = bench.final("F1")
    await until(lambda: bench.engine.running() == {"F1"})
    partials = [bench.partial(f"p{i}") for i in range(7)]
    # 6 partials join; the 7th waits (one slot is kept for finals)
    await until(lambda: len(bench.engine.running()) == 7 and bench.sched.depth == 1)
    second = bench.final("F2")
    await until(lambda: len(bench.engine.running()) == SLOTS)
    assert bench.engine.free == 0
    third = bench.final("F3", steps=2)
    assert await asyncio.wait_for(third, 30) == "F3"
    running = bench.engine.running()
    assert {"F1", "F2"} <= running and "p5#1" not in running  # the youngest partial left
    assert {f"p{i}#1" for i in range(5)} <= running
    assert not any(p.done() for p in partials)  # not answered, not failed: waiting again
    assert bench.sched.depth == 2  # p5 and p6
    bench.engine.release("p")
    bench.engine.release("F")
    answers = await asyncio.gather(*partials)
    assert answers == [f"p{i}#1" for i in range(5)] + ["p5#2", "p6#1"]
    assert bench.built["p5"] == 2
    assert await first == "F1" and await second == "F2"
    await until(lambda: not bench.sched.busy)  # the requeued job is counted once running
    assert len(bench.starts) == 10  # each job's start observed once (p5's restart is not)
    assert bench.sched.failed == 0


async def test_uploads_are_never_displaced(bench: Bench) -> None:
    """Six uploads, a partial and a final fill the slots; two more finals come: one
    displaces the partial, the other waits for an upload to end."""
    uploads = [bench.upload(f"u{i}") for i in range(6)]
    await until(lambda: len(bench.engine.running()) == 6)
    partial = bench.partial("p")
    await until(lambda: len(bench.engine.running()) == 7)
    held = bench.final("F0")
    await until(lambda: len(bench.engine.running()) == SLOTS)
    finals = [bench.final("F1"), bench.final("F2")]
    await until(lambda: "F1" in bench.engine.running())
    await bench.steps(20)
    assert bench.engine.running() == {f"u{i}" for i in range(6)} | {"F0", "F1"}
    assert not partial.done() and bench.sched.depth == 2  # p (waiting again) and F2
    bench.engine.release("u0")
    await until(lambda: "F2" in bench.engine.running())
    bench.engine.release("")
    assert await asyncio.gather(*uploads) == [f"u{i}" for i in range(6)]
    assert await asyncio.gather(held, *finals) == ["F0", "F1", "F2"]
    assert await partial == "p#2"


async def test_arrivals_are_gathered_into_one_take() -> None:
    """An upload still being decoded (admitted, no job yet): the loop's first take waits
    for its job, which joins the same take (one prefill, not two)."""
    sched = PriorityScheduler(max_queue=8, max_batch=SLOTS, gather=30.0)
    sched.start()
    bench = Bench(sched, Stepping())
    try:
        arriving = contextvars.copy_context()
        admission = arriving.run(sched.admit)  # its upload is decoding
        first = bench.upload("a", steps=2)
        await until(lambda: sched.gathers > 0)  # the take waits for it
        second = asyncio.create_task(
            sched.submit(never, batch=bench.spec(Req("b", 2)), admitted=True), context=arriving
        )
        assert await asyncio.wait_for(asyncio.gather(first, second), 20) == ["a", "b"]
        assert bench.engine.takes[0] == ["a", "b"]
        admission.release()
    finally:
        await asyncio.to_thread(sched.stop)


async def test_a_take_waits_for_no_one_when_nothing_arrives() -> None:
    sched = PriorityScheduler(max_queue=8, max_batch=SLOTS, gather=30.0)
    sched.start()
    bench = Bench(sched, Stepping())
    try:
        assert await asyncio.wait_for(bench.upload("a", steps=2), 20) == "a"
        assert sched.gathers == 0
        # an arrival that never comes holds a take for `gather` seconds at most
        sched.gather = 0.01
        admission = contextvars.copy_context().run(sched.admit)
        assert await asyncio.wait_for(bench.upload("b", steps=2), 20) == "b"
        assert sched.gathers > 0
        admission.release()
    finally:
        await asyncio.to_thread(sched.stop)


async def test_a_loop_with_rows_in_flight_never_waits_for_arrivals() -> None:
    """(Review of issue 50) the gather holds a take only while no row is in flight: with a
    row decoding, an upload that arrives while another is still being decoded joins at
    the next step, not `gather` seconds later."""
    sched = PriorityScheduler(max_queue=8, max_batch=SLOTS, gather=60.0)
    sched.start()
    bench = Bench(sched, Stepping())
    try:
        first = bench.upload("a")  # decodes until released
        await until(lambda: "a" in bench.engine.running())
        admission = contextvars.copy_context().run(sched.admit)  # an upload decoding
        second = bench.upload("b", steps=2)
        assert await asyncio.wait_for(second, 20) == "b"  # joined and done, "a" running
        assert "a" in bench.engine.running() and sched.gathers == 0
        bench.engine.release("a")
        assert await asyncio.wait_for(first, 20) == "a"
        admission.release()
    finally:
        bench.engine.release("")
        await asyncio.to_thread(sched.stop)


async def test_a_job_cancelled_while_its_take_gathers_never_decodes() -> None:
    """(Review of issue 50) a job taken into a gathering take is running from then on: its
    caller leaving during the gather makes its row leave at once, not decode on."""
    sched = PriorityScheduler(max_queue=8, max_batch=SLOTS, gather=60.0)
    sched.start()
    bench = Bench(sched, Stepping())
    try:
        admission = contextvars.copy_context().run(sched.admit)  # holds the first take
        first = bench.upload("x")  # decodes until released
        second = bench.upload("a")  # would too
        await until(lambda: sched.depth == 0 and sched.gathers > 0)  # both taken, waiting
        second.cancel()
        admission.release()  # the gather ends
        await until(lambda: "x" in bench.engine.running())
        await bench.steps(20)
        assert "a" not in bench.engine.running()
        bench.engine.release("x")
        assert await asyncio.wait_for(first, 20) == "x"
    finally:
        bench.engine.release("")
        await asyncio.to_thread(sched.stop)


async def test_a_partial_displaced_during_shutdown_is_answered_not_queued_again() -> None:
    """(Review of issue 50) once the queue is drained for shutdown, a partial's row that
    leaves for a final is answered `shutting_down` instead of waiting again in a queue no
    worker will take from."""
    from qwen3_asr_server.errors import UnavailableError
    from qwen3_asr_server.runtime.jobs import Job

    sched = PriorityScheduler(max_queue=8, max_batch=SLOTS)
    sched.start()
    await asyncio.to_thread(sched.stop)
    loop = asyncio.get_running_loop()
    job: Job[str] = Job(PARTIAL, 1, never, loop.create_future(), loop, state="running")
    sched._running += 1
    sched._row_done(job, None, RuntimeError("its row left for a final"), True)
    assert sched.depth == 0
    with pytest.raises(UnavailableError) as raised:
        await asyncio.wait_for(job.future, 5)
    assert raised.value.code == "shutting_down"
