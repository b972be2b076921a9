"""Background download of hub models into the HF cache, with progress (issue 33).

Needs only `huggingface_hub` (no torch): the file list and sizes come from the hub's model
info, each file is fetched with `hf_hub_download` (which resumes its `.incomplete` file),
and progress is read from the cache folder's size every second, so it covers every way
huggingface_hub may transfer a file. Progress goes to the log (a line every 5% or 10 s, not a
tqdm bar), to /health and to /metrics. A failed attempt is retried after a backoff that
doubles up to a cap (the model load's backoff); requests meanwhile get a 503
`model_downloading` that says how far it got, never a wait.
"""

from __future__ import annotations

import asyncio
import errno
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from loguru import logger

from ..errors import UnavailableError

State = Literal["pending", "downloading", "failed", "done"]
LOG_EVERY_S = 10.0
LOG_EVERY_PERCENT = 5.0
POLL_S = 1.0
RETRY_AFTER_MAX_S = 120  # a client is told to come back within this, whatever the ETA


@dataclass
class RepoFiles:
    """One repo's files at one commit, with their sizes (from the hub's model info)."""

    repo_id: str
    sha: str
    files: dict[str, int]

    @classmethod
    def from_info(cls, info: Any) -> RepoFiles:
        files = {s.rfilename: int(s.size or 0) for s in info.siblings or []}
        return cls(info.id, info.sha, files)


def fetch_info(repo_id: str, timeout: float | None = None) -> RepoFiles:
    from huggingface_hub import HfApi

    return RepoFiles.from_info(HfApi().model_info(repo_id, files_metadata=True, timeout=timeout))


def repo_folder(repo_id: str) -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))


def short_reason(exc: BaseException) -> str:
    """A download failure in a few words; the full exception goes to the log."""
    from huggingface_hub import constants

    text = f"{type(exc).__name__}: {exc}"
    if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "No space left" in text:
        return "the disk is full"
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return f"access denied by the hub (HTTP {status}; a gated model needs HF_TOKEN)"
    if status == 404:
        return "no such model on the hub (HTTP 404)"
    if status is not None:
        return f"the hub answered HTTP {status}"
    names = {type(e).__name__ for e in _chain(exc)}
    if names & {"ConnectError", "ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout"}:
        return f"cannot reach {constants.ENDPOINT} (network down or offline)"
    if "Consistency check failed" in text or names & {"ChunkedEncodingError", "ProtocolError"}:
        return "the connection broke during the transfer"
    first = text.splitlines()[0]
    return first[:160] + ("..." if len(first) > 160 else "")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


class BackgroundDownload:
    """Fetches `repos` into the HF cache once `run()` is started; retried until done."""

    def __init__(
        self,
        repos: list[str],
        *,
        retry_backoff: float = 5.0,
        max_backoff: float = 60.0,
        known: dict[str, RepoFiles] | None = None,
    ) -> None:
        self.repos = repos
        self.state: State = "pending"
        self.error: str | None = None
        self.failures = 0  # failed attempts, all told
        self.bytes_done = 0
        self.bytes_total = 0
        self._known = dict(known or {})
        self._retry_backoff = retry_backoff
        self._max_backoff = max_backoff
        self._retry_at = 0.0
        self._rate = 0.0  # bytes per second, smoothed
        self._sample: tuple[float, int] | None = None  # (time, bytes) of the last poll
        self._logged = (0.0, -LOG_EVERY_PERCENT)  # (time, percent) of the last log line
        self._stop = threading.Event()
        self.finished = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.state == "done"

    @property
    def percent(self) -> float:
        return 100.0 * self.bytes_done / self.bytes_total if self.bytes_total else 0.0

    def eta_s(self) -> float | None:
        if self._rate <= 0 or not self.bytes_total:
            return None
        return max(0.0, (self.bytes_total - self.bytes_done) / self._rate)

    def retry_in(self) -> float:
        return max(0.0, self._retry_at - time.monotonic()) if self.state == "failed" else 0.0

    def status(self) -> dict[str, Any]:
        """/health's `download` object."""
        eta = self.eta_s()
        return {
            "models": list(self.repos),
            "state": self.state,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "percent": round(self.percent, 1),
            "eta_s": None if eta is None or self.state != "downloading" else round(eta, 1),
            "error": self.error,
            "retry_in_s": round(self.retry_in(), 1),
            "failures": self.failures,
        }

    def unavailable(self) -> UnavailableError:
        """The 503 for a request that needs the model while it is being fetched."""
        what = f"The model {self.repos[0]!r}"
        size = f" of {_megabytes(self.bytes_total)}" if self.bytes_total else ""
        if self.state == "failed":
            wait = max(1, math.ceil(self.retry_in()))
            return UnavailableError(
                f"{what} is not downloaded yet: the download failed at {self.percent:.0f}%"
                f"{size} ({self.error}). The server tries again in {wait} s; without internet "
                f"here, run `qwen3-asr-server download {self.repos[0]} --to DIR` elsewhere and "
                "set MODEL_ID=DIR.",
                code="model_downloading",
                retry_after=wait,
            )
        eta = self.eta_s()
        left = f", about {_duration(eta)} left" if eta is not None else ""
        retry = min(RETRY_AFTER_MAX_S, max(1, math.ceil(eta))) if eta is not None else 10
        return UnavailableError(
            f"{what} is downloading: {self.percent:.0f}% done{size}{left}. Retry later "
            "(GET /health shows the progress).",
            code="model_downloading",
            retry_after=retry,
        )

    # -- running ------------------------------------------------------------------------
    async def run(self) -> None:
        """Download until done (backoff between attempts); cancelled at shutdown."""
        monitor = asyncio.create_task(self._monitor(), name="download-progress")
        try:
            while True:
                self.state, self.error = "downloading", None
                try:
                    await in_daemon_thread(self._fetch_all)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self._failed(exc)
                await asyncio.sleep(self.retry_in())
            self._poll()
            self.state = "done"
            logger.info("download of {} complete ({})", ", ".join(self.repos), self._size())
        finally:
            self._stop.set()
            monitor.cancel()
            with suppress(asyncio.CancelledError):
                await monitor
            self.finished.set()

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        backoff = min(self._max_backoff, self._retry_backoff * 2 ** min(self.failures - 1, 16))
        self._retry_at = time.monotonic() + backoff
        self.error = short_reason(exc)
        self.state = "failed"
        self._sample = None
        logger.opt(exception=exc).debug("download attempt failed")
        logger.error(
            "download of {} failed at {:.0f}% ({}); retrying in {:g} s",
            ", ".join(self.repos),
            self.percent,
            self.error,
            backoff,
        )

    def _fetch_all(self) -> None:
        from huggingface_hub import hf_hub_download

        for repo in self.repos:
            if repo not in self._known:
                self._known[repo] = fetch_info(repo)
        self.bytes_total = sum(sum(r.files.values()) for r in self._known.values())
        if self.failures == 0:
            logger.info(
                "downloading {} ({}) into the HF cache; requests get 503 until it is done",
                ", ".join(self.repos),
                self._size(),
            )
        for repo in self.repos:
            info = self._known[repo]
            for name in info.files:
                if self._stop.is_set():
                    return
                hf_hub_download(repo, name, revision=info.sha)

    def _size(self) -> str:
        return _megabytes(self.bytes_total) if self.bytes_total else "size unknown"

    async def _monitor(self) -> None:
        while True:
            await asyncio.to_thread(self._poll)
            self._log()
            await asyncio.sleep(POLL_S)

    def _poll(self) -> None:
        """Bytes on disk: finished files of the snapshot plus the `.incomplete` blobs."""
        done = 0
        for repo, info in self._known.items():
            folder = repo_folder(repo)
            snapshot = folder / "snapshots" / info.sha
            for name, size in info.files.items():
                if (snapshot / name).exists():
                    done += size
            for part in (folder / "blobs").glob("*.incomplete"):
                with suppress(OSError):
                    done += part.stat().st_size
        self.bytes_done = min(done, self.bytes_total) if self.bytes_total else done
        now = time.monotonic()
        if self._sample is not None and now > self._sample[0]:
            rate = (self.bytes_done - self._sample[1]) / (now - self._sample[0])
            self._rate = rate if self._rate <= 0 else 0.7 * self._rate + 0.3 * max(rate, 0.0)
        if self.state == "downloading":
            self._sample = (now, self.bytes_done)

    def _log(self) -> None:
        if self.state != "downloading" or not self.bytes_total:
            return
        now, percent = time.monotonic(), self.percent
        last_time, last_percent = self._logged
        if percent - last_percent < LOG_EVERY_PERCENT and now - last_time < LOG_EVERY_S:
            return
        self._logged = (now, percent)
        eta = self.eta_s()
        logger.info(
            "downloading {}: {:.0f}% ({:.1f} of {:.1f} MB){}",
            ", ".join(self.repos),
            percent,
            self.bytes_done / 1e6,
            self.bytes_total / 1e6,
            f", about {_duration(eta)} left" if eta is not None else "",
        )


async def in_daemon_thread(fn: Callable[[], None]) -> None:
    """`fn()` on a daemon thread: unlike `asyncio.to_thread`, a transfer that is still
    going does not hold the process at exit (Ctrl-C during a multi-GB file). The file
    stays `.incomplete` in the cache, and the next download resumes it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()

    def settle(exc: BaseException | None) -> None:
        if future.done():  # the waiter was cancelled
            return
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)

    def run() -> None:
        error: BaseException | None = None
        try:
            fn()
        except StopIteration as exc:  # a future cannot hold a StopIteration
            error = RuntimeError(repr(exc))
        except BaseException as exc:
            error = exc
        with suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=run, name="model-download", daemon=True).start()
    await future


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def _megabytes(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
