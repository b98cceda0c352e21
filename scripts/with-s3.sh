#!/usr/bin/env bash
# Runs a command beside a real S3 server: s3s-fs on 127.0.0.1 (a free port, a temp data folder,
# bucket `kvtier` created), its endpoint and credentials exported as KVTIER_S3_*; the server
# is stopped by PID and its folder removed when the command ends, however it ends.
#   scripts/with-s3.sh cargo nextest run --workspace
set -euo pipefail

bin=${KVTIER_S3S_BIN:-/opt/kvtier/s3s/bin/s3s-fs}
[ -x "$bin" ] || { echo "with-s3: s3s-fs not found at $bin (run scripts/setup.sh s3)" >&2; exit 1; }

data=$(mktemp -d -t kvtier-s3.XXXXXX)
mkdir "$data/kvtier"
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$data"
}
trap cleanup EXIT

export KVTIER_S3_ACCESS_KEY=kvtier-test-key
export KVTIER_S3_SECRET_KEY=kvtier-test-secret
# A random port; another one if it was taken (the server then exits) or never listens.
for attempt in 1 2 3 4 5 6 7 8; do
  port=$(shuf -i 20000-60999 -n 1)
  "$bin" --host 127.0.0.1 --port "$port" \
    --access-key "$KVTIER_S3_ACCESS_KEY" --secret-key "$KVTIER_S3_SECRET_KEY" "$data" \
    >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      # Someone answers: it must be our server, still running.
      sleep 0.2
      if kill -0 "$pid" 2>/dev/null; then break 2; fi
      break
    fi
    sleep 0.1
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=
done
[ -n "$pid" ] || { echo "with-s3: s3s-fs did not start (8 ports tried)" >&2; exit 1; }

export KVTIER_S3_ENDPOINT="http://127.0.0.1:$port"
export KVTIER_S3_DATA_DIR="$data"
echo "with-s3: s3s-fs (pid $pid) at $KVTIER_S3_ENDPOINT, data in $data"
"$@"
