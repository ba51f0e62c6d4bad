#!/usr/bin/env bash
# Creates .venv and installs the pinned stack (pyproject.toml + requirements.lock).
# Idempotent: when nothing changed since the last successful run it returns in seconds.
#   MMOA_VENV     where the environment lives (default .venv)
#   MMOA_EXTRAS   pip extras to install (default "dev": pytest and ruff)
#   PYTHON        interpreter that creates the venv (default python3, must be >= 3.11)
#   MMOA_BROWSER  0 skips the Chromium step (the web UI browser test is then skipped)
#   MMOA_DEEPSPEED 0 skips DeepSpeed (ZeRO-2/3; its CPU test is then skipped)
# It also installs Debian's chromium and chromium-driver (for the web UI browser test) when
# chromedriver is missing and apt-get can be used (root or passwordless sudo).
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then  # the header comment above
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
  exit 0
fi
cd "$(dirname "${BASH_SOURCE[0]}")"

# The browser test drives the system Chromium through the system chromedriver: no browser is
# ever downloaded. Quick when they are already there; never fatal (the test says why it skips).
ensure_browser() {
  [ "${MMOA_BROWSER:-1}" = "0" ] && return 0
  if command -v chromedriver >/dev/null 2>&1 \
     && { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; }; then
    return 0
  fi
  local sudo=""
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "[setup] note: chromium/chromedriver not found and apt-get is unavailable: the web UI" \
         "browser test will be skipped (install Chromium and its chromedriver to run it)" >&2
    return 0
  fi
  if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
      sudo="sudo -n"
    else
      echo "[setup] note: chromium/chromedriver not found; run 'sudo apt-get install chromium" \
           "chromium-driver' to enable the web UI browser test (it is skipped until then)" >&2
      return 0
    fi
  fi
  echo "[setup] installing Debian's chromium and chromium-driver for the web UI browser test"
  if ! $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver \
       >/dev/null 2>&1; then
    # A fresh machine has no package lists yet.
    $sudo apt-get update -qq >/dev/null 2>&1 || true
    if ! $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
         chromium-driver >/dev/null; then
      echo "[setup] warning: could not install chromium and chromium-driver with apt-get: the" \
           "web UI browser test will be skipped" >&2
      return 0
    fi
  fi
  echo "[setup] $(chromedriver --version 2>/dev/null | cut -d' ' -f1-2) installed"
}
ensure_browser

VENV=${MMOA_VENV:-.venv}
EXTRAS=${MMOA_EXTRAS:-dev}
PYTHON=${PYTHON:-python3}
STAMP="$VENV/.mmoa-setup-stamp"
DEEPSPEED=${MMOA_DEEPSPEED:-1}
WANT="$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1) extras=$EXTRAS deepspeed=$DEEPSPEED"

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
   && "$VENV/bin/python" -c "import mmoa" >/dev/null 2>&1; then
  echo "[setup] environment up to date: $VENV"
  exit 0
fi

if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "[setup] error: $PYTHON is $("$PYTHON" --version 2>&1); Python >= 3.11 is required." >&2
  echo "[setup] point PYTHON at a newer interpreter, e.g. PYTHON=python3.11 bash setup_env.sh" >&2
  exit 1
fi

echo "[setup] creating $VENV and installing the pinned stack (first run: a few minutes, ~5 GB)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -c requirements.lock -e ".[$EXTRAS]"
if [ "$DEEPSPEED" != "0" ]; then
  # DeepSpeed ships as a source package whose setup.py imports torch: build it against this
  # venv's torch (no build isolation, which would fetch a second torch) and without compiling
  # its CUDA ops (DS_BUILD_OPS=0; a GPU machine JIT-builds the few it uses).
  echo "[setup] installing DeepSpeed (ZeRO-2/3 for the SFT and MAPPO stages)"
  "$VENV/bin/python" -m pip install --quiet -c requirements.lock setuptools wheel
  DS_BUILD_OPS=0 "$VENV/bin/python" -m pip install --quiet --no-build-isolation \
    -c requirements.lock "deepspeed==$(sed -n 's/^deepspeed==//p' requirements.lock)"
fi
echo "$WANT" > "$STAMP"
echo "[setup] done: $("$VENV/bin/mmoa-cli" --version)"
