"""ENGINE=remote capacity (issue 29): no backend ever holds more than REMOTE_MAX_INFLIGHT
jobs, even when the others are down (the jobs wait for a slot instead), and DUAL_MODEL keeps
the backends' capacity and their /health and /metrics entries. A real front process and
the gated vLLM stand-in (tests/vllm_standin.py --gate), which counts the requests it holds.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

import speech
from proc import ServerProcess
from server import free_port
from test_remote import front_env, health, run_standin, wait_until


def post(front: ServerProcess, data: bytes) -> httpx.Response:
    files = {"file": ("a.wav", data)}
    return httpx.post(front.url + "/v1/audio/transcriptions", files=files, timeout=120)


def held(standin: str) -> dict[str, int]:
    return dict(httpx.get(standin + "/inflight", timeout=5).json())


def taken(state: dict[str, Any]) -> int:
    """Jobs the scheduler's threads took: on a backend, or waiting for a slot on one."""
    if state["queue_depth"] != 2:
        return 0
    return sum(b["inflight"] for b in state["backends"]) + state.get("backend_waiting", 0)


@pytest.mark.slow
def test_failover_keeps_the_survivor_within_remote_max_inflight() -> None:
    """Two backends of 2 slots each (4 scheduler slots), one down: the survivor gets 2 jobs
    at once, the other 2 taken jobs wait for its slots, the rest stay queued."""
    dead = f"http://127.0.0.1:{free_port()}/v1"
    data = speech.path("sentence_01.wav").read_bytes()
    with run_standin("--gate") as url:
        env = front_env([url + "/v1", dead], REMOTE_MAX_INFLIGHT="2")
        front = ServerProcess(env)
        try:
            front.wait_healthy()
            wait_until(lambda: health(front)["model_loaded"], 30)
            assert health(front)["backends"][1]["state"] == "down"
            with ThreadPoolExecutor(6) as pool:
                pending = [pool.submit(post, front, data) for _ in range(6)]
                try:
                    # the 4 slots' jobs were taken: each holds the backend or waits for it
                    wait_until(lambda: taken(health(front)) == 4, 60)
                    state = health(front)
                    assert state["backends"][0]["inflight"] == 2, state
                    assert state["backend_waiting"] == 2, state
                    wait_until(lambda: held(url)["now"] == 2, 60)
                finally:
                    httpx.post(url + "/open", timeout=5)
                answers = [p.result() for p in pending]
            assert [r.status_code for r in answers] == [200] * 6, [r.text for r in answers]
            assert all(r.json()["text"].startswith("stand-in heard") for r in answers)
            assert held(url)["max"] == 2
            assert health(front)["backend_waiting"] == 0
        finally:
            front.stop()


@pytest.mark.slow
def test_dual_model_keeps_the_backends_capacity_and_their_health() -> None:
    """ENGINE=remote with DUAL_MODEL (partials on the local whisper): uploads still use all
    REMOTE_MAX_INFLIGHT slots at once, and /health and /metrics still list the backend."""
    data = speech.path("sentence_01.wav").read_bytes()
    with run_standin("--gate") as url:
        env = front_env(
            [url + "/v1"],
            REMOTE_MAX_INFLIGHT="3",
            DUAL_MODEL="true",
            FAST_MODEL_ID="whisper-tiny.en",
            CPU_THREADS="1",
        )
        front = ServerProcess(env)
        try:
            front.wait_healthy()
            wait_until(lambda: health(front)["model_loaded"], 60)
            state = health(front)
            assert state["fast_model"]["engine"] == "whisper"
            assert state["backends_up"] == 1 and state["backends"][0]["url"] == url + "/v1"
            metrics = httpx.get(front.url + "/metrics", timeout=10).text
            assert f'asr_backend_up{{backend="{url}/v1"}} 1.0' in metrics
            with ThreadPoolExecutor(3) as pool:
                pending = [pool.submit(post, front, data) for _ in range(3)]
                try:
                    wait_until(lambda: held(url)["now"] == 3, 60)  # not one at a time
                finally:
                    httpx.post(url + "/open", timeout=5)
                answers = [p.result() for p in pending]
            assert [r.status_code for r in answers] == [200] * 3, [r.text for r in answers]
        finally:
            front.stop()


# -- the pool itself (no processes) ----------------------------------------------------------
def test_a_full_pool_waits_for_a_slot_and_a_caller_that_leaves_stops_waiting() -> None:
    from qwen3_asr_server.engines.base import JobCancelledError
    from qwen3_asr_server.engines.remote.pool import BackendPool

    pool = BackendPool(["http://a/v1", "http://b/v1"], max_inflight=1, probe_interval=5)
    a, b = pool.backends
    pool.mark_down(b, "unreachable")
    first = pool.acquire([])
    assert first is a
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire([])))
    waiter.start()
    wait_until(lambda: pool.waiting == 1, 30)
    assert a.inflight == 1 and not got
    pool.release(a, "answered", 0.1)
    waiter.join(30)
    assert got == [a] and a.inflight == 1 and pool.waiting == 0
    with pytest.raises(JobCancelledError):  # full, and nobody waits for the job any more
        pool.acquire([], should_stop=lambda: True)
    assert pool.acquire([a]) is None  # the only other backend is down: no wait, a 503
    pool.release(a, "answered", 0.1)
