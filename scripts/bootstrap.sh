#!/usr/bin/env bash
# Install everything the project needs on a fresh Debian/Ubuntu machine, idempotently:
# system packages (Java 17, Maven, PostgreSQL server, Chromium for the UI tests, Redis for the
# Celery executor) when missing, then a virtualenv in
# .venv with the pinned requirements and the project (editable). Fast when up to date.
#
#   --demo     only what `make demo` uses: no Chromium (the UI tests) and no Redis (the
#              Celery stack); `make test` and CI install everything
#   --dry-run  say which system packages are missing and would be installed; change nothing
set -euo pipefail
cd "$(dirname "$0")/.."

demo=0
dry_run=0
for arg in "$@"; do
  case "$arg" in
    --demo) demo=1 ;;
    --dry-run) dry_run=1 ;;
    *) echo "bootstrap: unknown option $arg (known: --demo, --dry-run)" >&2; exit 2 ;;
  esac
done

need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need+=(maven)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if [ "$demo" -eq 0 ]; then
  # The UI tests drive Debian's Chromium with Playwright (no browser download).
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  # The Celery executor's broker in the local stack (stack up --executor celery).
  command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
fi
if [ "$dry_run" -eq 1 ]; then
  echo "bootstrap: missing: ${need[*]:-nothing}"
  exit 0
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: missing ${need[*]}; install them (sudo apt-get install ${need[*]}) and rerun" >&2
    exit 2
  fi
  echo "bootstrap: installing ${need[*]} from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # The Debian package starts its own cluster on 5432; the project runs its own cluster.
  if command -v pg_lsclusters >/dev/null 2>&1; then
    pg_lsclusters -h 2>/dev/null | awk '{print $1, $2}' | while read -r v c; do
      pg_ctlcluster "$v" "$c" stop >/dev/null 2>&1 || true
    done
  fi
fi

python3 - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"bootstrap: Python 3.11+ is needed, found {sys.version.split()[0]}")
PY

stamp=.venv/.requirements.sha256
want=$(cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "bootstrap: creating .venv and installing the pinned requirements"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements-dev.txt
.venv/bin/python -m pip install -q --no-deps -e .
echo "$want" > "$stamp"
