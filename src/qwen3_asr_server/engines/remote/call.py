"""One call of the remote engine to one backend: the job's audio as WAV, the POST, and what a
failure means (the input's fault, a busy backend, one that is down or hung)."""

from __future__ import annotations

import io
import wave

import httpx
import numpy as np

from ...audio.pcm import SAMPLE_RATE
from ..base import EngineInputError
from .clients import ClientShelf
from .pool import response_message

CLIENT_ERRORS = {400, 413, 415, 422}  # the input's fault: every backend would refuse it
BUSY = {429, 500, 502, 503, 504}  # try another backend, but this one is not down


class BackendFailedError(Exception):
    """This backend gave no answer for the job; another backend may."""

    def __init__(self, message: str, down: bool, hung: bool = False) -> None:
        super().__init__(message)
        self.down = down
        self.hung = hung  # it timed out on the job: back only after a job succeeds


def encode_wav(samples: np.ndarray) -> bytes:
    """Mono float32 at 16 kHz -> 16-bit PCM WAV (what every backend decodes)."""
    # x 32768 and rounding: PCM that arrived as 16-bit (nearly all of it) passes unchanged.
    pcm = np.clip(np.rint(samples * 32768.0), -32768, 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())
    return out.getvalue()


TRIAL_WAV = encode_wav(np.zeros(SAMPLE_RATE // 2, np.float32))  # a trial job's audio
TRIAL_TIMEOUT = 10.0  # seconds at most a trial job may take (the probes wait for it)


async def post_job(
    shelf: ClientShelf, url: str, wav: bytes, form: dict[str, str], headers: dict[str, str]
) -> dict[str, str | None]:
    """POST one job's WAV to a backend with a client of its own: `{text, language}`, or
    BackendFailedError (another backend may answer) or EngineInputError (none would)."""
    client = shelf.take(url)
    answered = False
    try:
        r = await client.post(
            f"{url}/audio/transcriptions",
            files={"file": ("audio.wav", wav, "audio/wav")},
            data=form,
            headers=headers,
        )
        answered = True
    except httpx.PoolTimeout as exc:  # this job's own client: not the backend's fault
        raise BackendFailedError(f"no connection ({type(exc).__name__})", down=False) from exc
    except (httpx.ReadTimeout, httpx.WriteTimeout) as exc:  # connected, then no answer
        raise BackendFailedError(f"timed out on a job ({type(exc).__name__})", True, True) from exc
    except httpx.TimeoutException as exc:
        raise BackendFailedError(f"timed out ({type(exc).__name__})", down=True) from exc
    except httpx.HTTPError as exc:
        raise BackendFailedError(f"{type(exc).__name__}: {exc}", down=True) from exc
    finally:
        shelf.put_back(url, client, answered)
    if r.status_code in CLIENT_ERRORS:
        raise EngineInputError(f"The backend refused the request: {response_message(r)}")
    if r.status_code != 200:
        down = r.status_code not in BUSY
        raise BackendFailedError(f"HTTP {r.status_code}: {response_message(r)}", down=down)
    try:
        body = r.json()
        return {"text": str(body["text"]), "language": body.get("language")}
    except (ValueError, KeyError, TypeError) as exc:
        raise BackendFailedError(f"unexpected answer: {r.text[:200]!r}", down=True) from exc
