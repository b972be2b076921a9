"""Rows' prompts prepared off the inference thread (issue 50): each row's chat prompt, and
the processor's tokens and log-mel features of that row alone, on a small thread pool,
while the rows in flight keep stepping (the loop joins them once they are ready).

Each row is processed alone, so its features never depend on the rows beside it (a batch
would pad every row's audio to the longest), and a prompt the processor refuses fails its
own row only. Each worker thread has its own copy of the processor: a fast tokenizer is
not safe to share across threads (it changes its padding state per call). torch is
imported only inside calls.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..base import TranscribeRequest
from .guard import RowSpec
from .prefill import Prompts
from .rows import Row, padded, prompt_for

Joining = list[tuple[object, TranscribeRequest, Any]]  # (handle, request, should_stop)


def one_thread(started: threading.Barrier) -> None:
    """A preparer thread runs torch (the log-mel's STFT) on one core: with torch's default,
    each thread brings its own OpenMP team, and on a small CPU the teams fight the inference
    thread's (measured on 2 cores: a decode step of 8 rows took 3.7 ms instead of 0.9 ms).
    torch keeps the count last set as the default of every thread that starts torch later,
    so this thread takes its own default first, then sets its own count; the caller puts
    the default back once every preparer thread has started (`Preparer.__init__`)."""
    import torch

    torch.get_num_threads()  # this thread's torch threads start now, at the default
    torch.set_num_threads(1)
    started.wait()


class Pending:
    """The rows of one take, being prepared: each a Row with its prompts, or its error."""

    def __init__(self, futures: list[Future[Row | Exception]]) -> None:
        self.futures = futures

    def __len__(self) -> int:
        return len(self.futures)

    def ready(self) -> bool:
        return all(f.done() for f in self.futures)

    def rows(self) -> list[Row | Exception]:
        """Waits for every row (a row's own failure is its answer, never raised here)."""
        return [f.result() for f in self.futures]


class Preparer:
    def __init__(
        self, sdk: Any, spec: Callable[[TranscribeRequest, Any], RowSpec], workers: int
    ) -> None:
        import torch

        workers = max(1, workers)
        self.sdk = sdk
        self.spec = spec
        default = torch.get_num_threads()
        started = threading.Barrier(workers + 1)
        self.pool = ThreadPoolExecutor(
            workers, "qwen-prepare", initializer=one_thread, initargs=(started,)
        )
        for _ in range(workers):  # every thread starts now (one task each)
            self.pool.submit(lambda: None)
        started.wait(timeout=60)
        torch.set_num_threads(default)  # the default of threads that start torch later
        self.local = threading.local()

    def __call__(self, joining: Joining) -> Pending:
        return Pending([self.pool.submit(self.one, h, r) for h, r, _ in joining])

    def one(self, handle: object, request: TranscribeRequest) -> Row | Exception:
        try:
            prompt, forced = prompt_for(self.sdk, request)
            processor = self.processor()
            row = Row(handle, request, self.spec(request, processor.tokenizer), forced)
            inputs = processor(
                text=[prompt], audio=[padded(request.audio)], return_tensors="pt", padding=True
            )
            row.prompts = Prompts.of(inputs)
            return row
        except Exception as exc:  # this row's own failure
            return exc

    def processor(self) -> Any:
        """This worker thread's own copy of the SDK's processor."""
        mine = getattr(self.local, "processor", None)
        if mine is None:
            mine = self.local.processor = copy.deepcopy(self.sdk.processor)
        return mine

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
