# qwen3-asr-server image. One Dockerfile, two variants chosen by build args:
#
#   CPU (default): python:3.11-slim-bookworm + the CPU torch wheel. Serves the bundled offline
#   model (MODEL_ID=whisper-tiny.en) and Qwen on CPU.
#     docker build -t qwen3-asr-server:cpu .
#
#   CUDA: a CUDA runtime base + the torch build for that CUDA (PyPI's torch 2.13.0 is CUDA 13.0;
#   the host driver must support it, >= 580). Ubuntu 24.04's python3 is 3.12.
#     docker build -t qwen3-asr-server:cuda \
#       --build-arg BASE_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04 \
#       --build-arg TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cu130" .
#   Optional flash-attention 2: --build-arg FLASH_ATTN_WHEEL=<URL or path of a prebuilt wheel
#   matching the torch, CUDA and Python versions> (building it needs nvcc, which a runtime
#   base does not have).
#
# Any Debian/Ubuntu base works: when it has no Python >= 3.11 with venv, the distribution's
# python3 is installed with apt (`make image-test` builds FROM a debootstrapped bookworm).
#
# Layer order: system Python -> torch -> requirements.txt -> the package (--no-deps), so a
# code change re-runs only the last, small layer.

ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

# pip reads PIP_CERT itself: a CA bundle for TLS-intercepting networks (`make image-test`
# mounts the host's). Leave unset normally.
ARG PIP_CERT
ARG DEBIAN_FRONTEND=noninteractive
ARG APP_UID=1000

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_DEFAULT_TIMEOUT=120 \
    PIP_RETRIES=5 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# Python >= 3.11 in a venv, and the non-root user. (CUDA Ubuntu bases ship a user at uid 1000:
# it makes way for ours, so a bind-mounted cache owned by a desktop user's 1000 stays usable.)
RUN set -eux; \
    if ! python3 -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 11))' \
            2>/dev/null; then \
        for i in 1 2 3; do apt-get update && break; sleep 5; done; \
        apt-get install -y --no-install-recommends python3 python3-venv ca-certificates; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -m venv /opt/venv; \
    /opt/venv/bin/python -c 'import sys; assert sys.version_info >= (3, 11), sys.version'; \
    pip install --upgrade pip; \
    old="$(getent passwd "$APP_UID" | cut -d: -f1)"; \
    if [ -n "$old" ]; then userdel --remove "$old" 2>/dev/null || true; fi; \
    if getent group "$APP_UID" >/dev/null; then groupdel "$(getent group "$APP_UID" | cut -d: -f1)"; fi; \
    groupadd --gid "$APP_UID" app; \
    useradd --uid "$APP_UID" --gid app --create-home --home-dir /home/app --shell /usr/sbin/nologin app; \
    mkdir -p /data/huggingface /app; \
    chown app:app /data/huggingface /app

# torch first, on its own layer. Default: the CPU wheel from the PyTorch index. CUDA: the
# PyTorch index for that CUDA (or "" for PyPI's default build). A local wheel directory:
# --build-arg TORCH_PIP_ARGS="--find-links /wheels" (mounted with -v DIR:/wheels:ro).
ARG TORCH_VERSION=2.13.0
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
RUN pip install ${TORCH_PIP_ARGS} "torch==${TORCH_VERSION}" \
    && python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# The server's runtime dependencies (Qwen SDK, faster-whisper + the bundled tiny.en model,
# Silero VAD, openai). The constraint keeps the torch installed above.
COPY requirements.txt /tmp/requirements.txt
RUN echo "torch==${TORCH_VERSION%%+*}" > /tmp/constraints.txt \
    && pip install -c /tmp/constraints.txt -r /tmp/requirements.txt \
    && pip check \
    && rm /tmp/requirements.txt /tmp/constraints.txt

ARG FLASH_ATTN_WHEEL=
RUN if [ -n "$FLASH_ATTN_WHEEL" ]; then pip install --no-deps "$FLASH_ATTN_WHEEL"; fi

# The package itself, without dependencies: the only layer a code change rebuilds.
COPY pyproject.toml README.md /tmp/src/
COPY src /tmp/src/src
RUN pip install --no-deps /tmp/src && rm -rf /tmp/src

# Threads: cap OpenMP/MKL (raise on a big CPU box, or set CPU_THREADS); torch.compile workers 1.
ENV HOST=0.0.0.0 \
    PORT=8000 \
    HF_HOME=/data/huggingface \
    OMP_NUM_THREADS=4 \
    MKL_NUM_THREADS=4 \
    TORCHINDUCTOR_COMPILE_THREADS=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /app
USER ${APP_UID}:${APP_UID}
EXPOSE 8000
VOLUME ["/data/huggingface"]

# No curl in the image: Python's urllib. Fails on a refused connection or a non-2xx status.
# https (certificate not checked: it is for a host name, this is loopback) when SSL_CERTFILE is set.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, ssl, urllib.request; tls = bool(os.environ.get('SSL_CERTFILE')); urllib.request.urlopen(('https' if tls else 'http') + '://127.0.0.1:%s/health' % os.environ.get('PORT', '8000'), timeout=4, context=ssl._create_unverified_context() if tls else None)"]

CMD ["python", "-m", "qwen3_asr_server"]
