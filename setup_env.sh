#!/usr/bin/env bash
# Creates .venv and installs the pinned stack (pyproject.toml + requirements.lock).
# Idempotent: when nothing changed since the last successful run it returns in seconds.
#   MMOA_VENV     where the environment lives (default .venv)
#   MMOA_EXTRAS   pip extras to install (default "dev": pytest and ruff)
#   PYTHON        interpreter that creates the venv (default python3, must be >= 3.11)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

VENV=${MMOA_VENV:-.venv}
EXTRAS=${MMOA_EXTRAS:-dev}
PYTHON=${PYTHON:-python3}
STAMP="$VENV/.mmoa-setup-stamp"
WANT="$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1) extras=$EXTRAS"

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
echo "$WANT" > "$STAMP"
echo "[setup] done: $("$VENV/bin/mmoa-cli" --version)"
