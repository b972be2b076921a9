"""`qwen3-asr-server check`: which model would `make run` serve and why, and can this machine
serve it? Answered without starting the server; every problem gets a one-line fix and the
exit code is 1."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import Settings
from ..engines.probe import Machine, probe
from ..engines.qwen.load import choose_dtype
from ..logging import redact_url
from ..models.cache import LOCAL, Cached, find_cached, size_mb
from ..models.choice import BUNDLED, engine_kind, gpu_present, installed, served_model_id
from ..models.plan import FIX, ModelPlan, plan_model, unreachable

HEADROOM_MB = 1000  # activations, the server itself, the VAD
EXTRAS = {  # engine -> (modules, the extra that installs them)
    "qwen": (("torch", "transformers", "qwen_asr"), "qwen"),
    "whisper": (("faster_whisper", "ctranslate2"), "whisper"),
}


@dataclass
class Finding:
    ok: bool
    text: str
    fix: str = ""


def available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def extras(engine: str, settings: Settings) -> list[Finding]:
    found = []
    if engine in EXTRAS:
        modules, extra = EXTRAS[engine]
        absent = [m for m in modules if not installed(m)]
        fix = f"pip install 'qwen3-asr-server[{extra}]'"
        text = f"{engine} engine packages: " + (f"missing {', '.join(absent)}" if absent else "ok")
        found.append(Finding(not absent, text, fix))
    if settings.segment_vad:
        absent = [m for m in ("silero_vad", "onnxruntime") if not installed(m)]
        text = "Silero VAD: " + (f"missing {', '.join(absent)}" if absent else "ok")
        fix = "pip install 'qwen3-asr-server[vad]' (or SEGMENT_VAD=false)"
        found.append(Finding(not absent, text, fix))
    return found


def device(engine: str, settings: Settings, machine: Machine) -> tuple[list[Finding], str, bool]:
    """Findings about torch/CUDA, the dtype and whether the engine would use CUDA."""
    cuda_seen = machine.cuda if engine == "qwen" else machine.ctranslate2_cuda > 0
    cuda = settings.device == "cuda" or (settings.device == "auto" and cuda_seen)
    torch_text = (
        f"torch {machine.torch} (built for CUDA {machine.torch_cuda or 'none: CPU build'}), "
        f"CUDA {'available: ' + ', '.join(machine.gpus) if machine.cuda else 'not available'}"
        if machine.torch
        else "torch not installed"
    )
    found = [
        Finding(machine.torch is not None or engine != "qwen", torch_text, "pip install torch")
    ]
    if cuda and not cuda_seen:
        fix = "install a CUDA build of torch / the NVIDIA driver, or set DEVICE=cpu"
        found.append(Finding(False, f"DEVICE=cuda but the {engine} engine sees no GPU", fix))
        cuda = False
    if engine == "qwen":
        dtype = choose_dtype(settings.dtype, cuda, machine.bf16)
    else:
        dtype = "float16" if cuda else "int8"
    found.append(Finding(True, f"would run on {'cuda' if cuda else 'cpu'}, dtype {dtype}"))
    return found, dtype, cuda


def cache_finding(cached: Cached, what: str) -> Finding:
    if cached.path is None:
        fix = f"qwen3-asr-server download {cached.repo_id} (offline: --to DIR elsewhere)"
        return Finding(False, f"{what} {cached.repo_id}: {cached.note}", fix)
    if cached.missing and cached.note == LOCAL:  # a directory of the user's: not downloadable
        fix = "point the setting at a directory that holds a Qwen3-ASR or CTranslate2 model"
        missing = ", ".join(cached.missing)
        return Finding(False, f"{what} {cached.repo_id}: holds no model, missing {missing}", fix)
    if cached.missing:
        fix = f"qwen3-asr-server download {cached.repo_id}"
        missing = ", ".join(cached.missing)
        return Finding(False, f"{what} {cached.repo_id}: incomplete, missing {missing}", fix)
    where = cached.note or f"cached at {cached.path} ({size_mb(cached.path):.0f} MB)"
    return Finding(True, f"{what} {cached.repo_id}: {where}")


def memory(cached: Cached, dtype: str, cuda_free_mb: float, cuda: bool) -> Finding:
    """Free memory against the weights (float32 on CPU doubles a bf16 checkpoint)."""
    free = cuda_free_mb if cuda else available_mb()
    where = "GPU" if cuda else "RAM"
    if cached.path is None:
        return Finding(
            True,
            f"memory: {free:.0f} MB free {where}; the model's size is known once it is downloaded",
        )
    weights = 0.0 if cached.note.startswith("bundled") else size_mb(cached.path)
    need = weights * (2 if dtype == "float32" else 1) + HEADROOM_MB
    text = f"memory: {free:.0f} MB free {where}, the model needs about {need:.0f} MB"
    return Finding(free >= need, text, "free memory, or a smaller model (MODEL_ID)")


def serving(settings: Settings, plan: ModelPlan) -> Finding:
    """Which model `make run` would serve, and why."""
    wanted = served_model_id(settings)
    if settings.engine == "remote":
        named = f"{wanted} (REMOTE_MODEL)" if settings.remote_model else "the model they name"
        return Finding(True, f"`make run` serves {named} from the backends; a front holds none")
    why = (
        "MODEL_ID is set"
        if settings.model_id
        else f"MODEL_ID is unset: the default on {'CUDA' if gpu_present() else 'CPU'}"
    )
    if plan.fallback is not None:
        return Finding(
            False,
            f"`make run` would serve the bundled {BUNDLED} instead of {wanted} ({why}): "
            f"{wanted} is {plan.fallback.reason}",
            f"run `{FIX}` with internet access, or set MODEL_ID",
        )
    return Finding(True, f"`make run` serves {wanted} ({why})")


def fetch_finding(repo_id: str, plan: ModelPlan, what: str) -> Finding:
    """A hub model the server would fetch at start: asked of the hub first (a typo, or a hub
    out of reach, is a problem now, not a 503 after start)."""
    reason = "" if repo_id in plan.known else unreachable(repo_id, plan)
    if reason:
        fix = "check the name, or run `qwen3-asr-server download` where the hub can be reached"
        return Finding(False, f"{what} {repo_id}: {reason}", fix)
    known = plan.known.get(repo_id)
    size = f" ({sum(known.files.values()) / 1e6:.0f} MB)" if known else ""
    return Finding(
        True,
        f"{what} {repo_id}: not cached yet; the server downloads it in the background at "
        f"start{size} and answers 503 model_downloading until then",
    )


def check(settings: Settings) -> int:
    plan = plan_model(settings, announce=False)
    model_id = served_model_id(plan.settings)
    engine = engine_kind(plan.settings, model_id, undecided="qwen")
    print(f"model {model_id} on the {engine} engine")
    findings = [serving(settings, plan), *extras(engine, settings)]
    if engine == "remote":
        findings.append(
            Finding(True, f"remote backends: {', '.join(map(redact_url, settings.remote_urls))}")
        )
    else:
        machine = probe()
        found, dtype, cuda = device(engine, settings, machine)
        findings += found
        cached = find_cached(model_id)
        models = [(model_id, "model")]
        if settings.forced_aligner_id and engine == "qwen":  # the aligner is Qwen's only
            models.append((settings.forced_aligner_id, "aligner"))
        if settings.dual_model:
            models.append((settings.fast_model_id, "fast model"))
        for repo_id, what in models:
            if repo_id in plan.download:
                findings.append(fetch_finding(repo_id, plan, what))
            else:
                findings.append(cache_finding(find_cached(repo_id), what))
        findings.append(memory(cached, dtype, machine.gpu_free_mb, cuda))
    for f in findings:
        print(("ok      " if f.ok else "PROBLEM ") + f.text + ("" if f.ok else f" -> {f.fix}"))
    problems = sum(not f.ok for f in findings)
    print(f"{problems} problem(s)" if problems else "ready to serve")
    return 1 if problems else 0
