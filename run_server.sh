#!/usr/bin/env bash
# Start the retrieval server: gunicorn, ONE worker process holding ONE index, many threads.
#
#   bash run_server.sh --index data/demo/index                  # 127.0.0.1:8000
#   MMOA_RETRIEVER_INDEX=data/wiki MMOA_RETRIEVER_PORT=8001 \
#   MMOA_RETRIEVER_THREADS=64 MMOA_RETRIEVER_TOKEN=secret bash run_server.sh
#
# Every option of `python flask_server.py --help` can be given as an argument or as
# MMOA_RETRIEVER_<OPTION> (arguments win). Binds 127.0.0.1 unless --host / MMOA_RETRIEVER_HOST
# says otherwise. The access log goes to stdout (--access-log FILE to write a file).
# Python: $MMOA_PYTHON, else the repository's .venv, else the active virtualenv, else python3.
# Exit codes: 2 bad arguments, 3 index missing or unreadable, 4 index/corpus/encoder mismatch
# or an index file whose sha256 differs from the one recorded at build time (--skip-checksums).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${MMOA_PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"
    elif [[ -n "${VIRTUAL_ENV:-}" ]]; then PYTHON="$VIRTUAL_ENV/bin/python"
    else PYTHON=python3; fi
fi
if ! "$PYTHON" -c 'import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in ("flask", "gunicorn", "faiss", "pyarrow", "torch")))'
then
    echo "run_server.sh: $PYTHON lacks the project's packages (flask, gunicorn, faiss, pyarrow," \
         "torch); run 'bash setup_env.sh' or point MMOA_PYTHON at the right interpreter" >&2
    exit 2
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
exec "$PYTHON" "$ROOT/flask_server.py" "$@"
