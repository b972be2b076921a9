"""The command line (issue 17): --help from Settings, flags over env, exit 2 on bad input,
`download` (offline, from a cache a fixture fills with the tiny checkpoint under an HF repo
id, and `--to DIR`), and `check` on this machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import speech
from qwen3_asr_server.app import create_app
from qwen3_asr_server.cli.main import build_parser, load_settings
from qwen3_asr_server.config import Settings
from server import live_server

REPO = "test-org/tiny-qwen3-asr"


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):  # type: ignore[no-untyped-def]
    return subprocess.run(
        [sys.executable, "-m", "qwen3_asr_server", *args],
        env={**os.environ, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, tiny_qwen_dir: Path) -> Path:
    """An HF hub cache holding the tiny checkpoint as REPO (the layout huggingface_hub
    writes: blobs are plain files here, refs/main names the snapshot)."""
    hub = tmp_path_factory.mktemp("hub")
    folder = hub / ("models--" + REPO.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(tiny_qwen_dir, folder / "snapshots" / commit)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    return hub


def offline(hub: Path) -> dict[str, str]:
    return {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "HF_HOME": str(hub.parent)}


# -- help, flags, errors -----------------------------------------------------------------------
def test_help_lists_every_setting_with_its_env_name_and_default(tmp_path: Path) -> None:
    done = cli("--help", cwd=tmp_path)
    assert done.returncode == 0
    for command in ("serve", "download", "check"):
        assert command in done.stdout
    for name in Settings.model_fields:
        assert "--" + name.replace("_", "-") in done.stdout, name
        assert f"[{name.upper()}; default:" in " ".join(done.stdout.split()), name
    assert "--model MODEL_ID" in done.stdout  # the short alias
    serve = cli("serve", "--help", cwd=tmp_path)
    assert serve.returncode == 0 and "--max-pending-audio-seconds" in serve.stdout


def test_flags_override_the_environment_and_dotenv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("MAX_QUEUE=3\nIDLE_TIMEOUT=9\n")
    monkeypatch.setenv("MAX_BATCH_SIZE", "2")
    monkeypatch.setenv("PRELOAD", "true")

    def settings(*argv: str) -> Settings:
        args = build_parser().parse_args(list(argv))
        return load_settings({k: v for k, v in vars(args).items() if k in Settings.model_fields})

    plain = settings()
    assert (plain.max_queue, plain.idle_timeout, plain.max_batch_size, plain.preload) == (
        3,
        9.0,
        2,
        True,
    )
    flagged = settings("serve", "--max-queue", "7", "--max-batch-size", "5", "--no-preload")
    assert (flagged.max_queue, flagged.max_batch_size, flagged.preload) == (7, 5, False)
    assert flagged.idle_timeout == 9.0  # what no flag names keeps its source
    assert settings("--model", "whisper-tiny.en").model_id == "whisper-tiny.en"


def test_a_flag_overrides_the_port_of_a_real_server(tmp_path: Path) -> None:
    from server import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "qwen3_asr_server", "serve", "--port", str(port), "--model",
         "whisper-tiny.en"],
        env={**os.environ, "PORT": "1", "HOST": "127.0.0.1", "LOG_LEVEL": "WARNING"},
        cwd=tmp_path,
    )  # fmt: skip
    try:
        import time

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        assert health.json()["model_id"] == "whisper-tiny.en"
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "abc"], "PORT: Input should be a valid integer"),
        (["--engine", "vllm"], "ENGINE: Input should be"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["serve", "--ssl-certfile", "/nonexistent.pem"], "TLS needs both"),
        # issue 41: accepted, then every request failed with "expected scalar type Float"
        (["check", "--quantize", "int8", "--dtype", "bfloat16"], "QUANTIZE=int8 quantizes"),
        (["serve", "--quantize", "int8", "--dtype", "float16"], "use DTYPE=auto or float32"),
    ],
)
def test_bad_flags_exit_2_with_one_clear_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    done = cli(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


# -- download ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_download_offline_reports_a_complete_cache_and_writes_a_servable_dir(
    hub: Path, tmp_path: Path
) -> None:
    done = cli("download", REPO, env=offline(hub), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "already in the cache, complete" in done.stdout and "MB)" in done.stdout
    target = tmp_path / "carry"
    done = cli("download", REPO, "--to", str(target), env=offline(hub), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"MODEL_ID={target}" in done.stdout
    assert (target / "model.safetensors").is_file() and not (target / "config.json").is_symlink()
    # MODEL_ID=DIR serves
    settings = Settings(_env_file=None, model_id=str(target), device="cpu", max_new_tokens=8)  # type: ignore[call-arg]
    with live_server(create_app(settings)) as srv:
        r = httpx.post(
            srv.url + "/v1/audio/transcriptions",
            files={"file": ("a.wav", speech.path("sentence_02.wav").read_bytes())},
            timeout=120,
        )
    assert r.status_code == 200, r.text


def test_download_of_an_absent_model_offline_says_what_to_do(hub: Path, tmp_path: Path) -> None:
    done = cli("download", "test-org/not-here", env=offline(hub), cwd=tmp_path)
    assert done.returncode == 1
    assert "test-org/not-here: not in the HF cache" in done.stdout
    assert "HF_HUB_OFFLINE" in done.stdout and "--to DIR" in done.stdout


def test_download_names_what_an_incomplete_cache_misses(
    hub: Path, tmp_path: Path, tiny_qwen_dir: Path
) -> None:
    broken = tmp_path / "hub"
    shutil.copytree(hub, broken)
    snapshot = next((broken / ("models--" + REPO.replace("/", "--")) / "snapshots").iterdir())
    (snapshot / "model.safetensors").unlink()
    done = cli("download", REPO, env=offline(broken), cwd=tmp_path)
    assert done.returncode == 1
    assert "incomplete" in done.stdout and "model weights" in done.stdout


def test_download_defaults_to_the_configured_models(hub: Path, tmp_path: Path) -> None:
    env = {**offline(hub), "MODEL_ID": REPO, "FORCED_ALIGNER_ID": "test-org/aligner"}
    done = cli("download", env=env, cwd=tmp_path)
    assert done.returncode == 1  # the aligner is not cached
    assert f"{REPO}: already in the cache" in done.stdout
    assert "test-org/aligner: not in the HF cache" in done.stdout


# -- check -------------------------------------------------------------------------------------
def test_check_on_this_machine(hub: Path, tmp_path: Path) -> None:
    done = cli("check", "--model", REPO, env=offline(hub), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"model {REPO} on the qwen engine" in out
    assert "CUDA not available" in out and "would run on cpu, dtype float32" in out
    assert f"model {REPO}: cached at" in out
    assert "ready to serve" in out
    missing = cli(
        "check", "--model", REPO, "--forced-aligner-id", "test-org/aligner", "--device", "cuda",
        env=offline(hub), cwd=tmp_path,
    )  # fmt: skip
    assert missing.returncode == 1
    assert "PROBLEM aligner test-org/aligner: not in the HF cache" in missing.stdout
    assert "qwen3-asr-server download test-org/aligner" in missing.stdout
    assert "PROBLEM DEVICE=cuda but the qwen engine sees no GPU" in missing.stdout
    assert "2 problem(s)" in missing.stdout


def test_check_explains_a_mistyped_local_path(tmp_path: Path) -> None:
    done = cli("check", "--model", "./no-such-model-dir", "--engine", "qwen", cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "no such directory, and not a Hugging Face repo id" in done.stdout


@pytest.mark.slow
def test_download_of_the_bundled_model_and_of_a_local_dir_copies_them(
    tmp_path: Path, tiny_qwen_dir: Path
) -> None:
    """Issue 29: `--to DIR` copies what needs no download too, into a servable DIR."""
    bundled = tmp_path / "whisper"
    done = cli("download", "whisper-tiny.en", "--to", str(bundled), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing to download" not in done.stdout
    assert f"copied to {bundled}; use it with MODEL_ID={bundled}" in done.stdout
    assert (bundled / "model.bin").is_file() and (bundled / "config.json").is_file()
    settings = Settings(_env_file=None, model_id=str(bundled), idle_timeout=0)  # type: ignore[call-arg]
    with live_server(create_app(settings)) as srv:
        r = httpx.post(
            srv.url + "/v1/audio/transcriptions",
            files={"file": ("a.wav", speech.path("sentence_01.wav").read_bytes())},
            timeout=120,
        )
        assert srv.get("/health").json()["engine"] == "whisper"
    assert r.status_code == 200 and "quick" in r.json()["text"].lower(), r.text

    shutil.copytree(tiny_qwen_dir, tmp_path / "local-dir")
    done = cli("download", "./local-dir", "--to", "carried", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "copied to carried; use it with MODEL_ID=carried" in done.stdout
    names = sorted(p.name for p in tiny_qwen_dir.iterdir())
    assert sorted(p.name for p in (tmp_path / "carried").iterdir()) == names

    done = cli("download", "./local-dir", "--to", "local-dir/inside", cwd=tmp_path)
    assert done.returncode == 1
    assert "not copied to local-dir/inside" in done.stdout and "choose another DIR" in done.stdout
    assert not (tmp_path / "local-dir" / "inside").exists()


# -- issue 41: model paths -------------------------------------------------------------------
@pytest.mark.parametrize("command", [["serve"], ["transcribe", "a.wav"]])
def test_a_model_dir_that_holds_no_model_exits_2_with_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    """It crashed `serve` and `transcribe` with a traceback from engine_spec."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "a.wav").write_bytes(speech.path("sentence_02.wav").read_bytes())
    done = cli(*command, "--model", str(tmp_path / "empty"), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "holds neither a Qwen3-ASR checkpoint" in done.stderr


def test_check_does_not_offer_to_download_a_local_dir(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = cli("check", "--model", str(tmp_path / "empty"), "--engine", "qwen", cwd=tmp_path)
    assert done.returncode == 1
    assert "holds no model" in done.stdout and "download" not in done.stdout, done.stdout


def test_a_tilde_in_model_id_is_the_home_directory(tmp_path: Path, tiny_qwen_dir: Path) -> None:
    """A `~` in .env reached the engines unexpanded: `check` passed, the load failed."""
    home = tmp_path / "home"
    shutil.copytree(tiny_qwen_dir, home / "models" / "tiny")
    (tmp_path / ".env").write_text("MODEL_ID=~/models/tiny\n")
    settings = Settings(_env_file=tmp_path / ".env")  # type: ignore[call-arg]
    assert settings.model_id == os.path.expanduser("~/models/tiny")
    done = cli("check", env={"HOME": str(home)}, cwd=tmp_path)
    assert f"model {home}/models/tiny on the qwen engine" in done.stdout, done.stdout
    assert f"model {home}/models/tiny: a local directory" in done.stdout, done.stdout


def test_check_leaves_the_aligner_out_for_a_whisper_model(tmp_path: Path) -> None:
    """FORCED_ALIGNER_ID is Qwen's: it was a PROBLEM (exit 1) for whisper-tiny.en."""
    env = {"HF_HUB_OFFLINE": "1"}
    done = cli(
        "check", "--model", "whisper-tiny.en", "--forced-aligner-id", "test-org/aligner",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    assert "aligner" not in done.stdout


def test_download_of_an_aligner_suggests_forced_aligner_id(
    tmp_path: Path, tiny_qwen_dir: Path
) -> None:
    """issue 41: `download <aligner> --to DIR` said "use it with MODEL_ID=DIR"."""
    repo = "test-org/Qwen3-ForcedAligner-tiny"
    hub = tmp_path / "hub"
    folder = hub / ("models--" + repo.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(tiny_qwen_dir, folder / "snapshots" / commit)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    target = tmp_path / "aligner"
    done = cli("download", repo, "--to", str(target), env=offline(hub), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"use it with FORCED_ALIGNER_ID={target}" in done.stdout, done.stdout
    absent = cli("download", "Qwen/Qwen3-ForcedAligner-0.6B", env=offline(hub), cwd=tmp_path)
    assert "(then FORCED_ALIGNER_ID=DIR)" in absent.stdout, absent.stdout


def test_engine_whisper_without_a_model_serves_the_bundled_one(tmp_path: Path) -> None:
    """issue 41: ENGINE=whisper with no MODEL_ID looked for the Qwen default as a whisper
    model."""
    done = cli("check", "--engine", "whisper", env={"HF_HUB_OFFLINE": "1"}, cwd=tmp_path)
    assert done.returncode == 0, done.stdout
    assert "model whisper-tiny.en on the whisper engine" in done.stdout
