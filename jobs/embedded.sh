#!/usr/bin/env bash
# The embedded default: a local Ray head (dashboard on 127.0.0.1:8265, usage stats off), the
# main job submitted to it with `ray job submit` (logs followed), then where to look.
# PROFILE=smoke|quick|paper|FILE picks the profile (default smoke), extra arguments go to
# jobs/train_all.py, KEEP_RAY=1 leaves the Ray head running afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
# The job's `python` is the one on the PATH of the process that starts the head.
export PATH="$PWD/.venv/bin:$PATH"
export RAY_USAGE_STATS_ENABLED=0
# Ray >= 2.59 protects local clusters with a token (kept in ~/.ray/auth_token); say so
# explicitly so that `ray job submit` sends it too.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
# a Ray Train worker importing torch on a busy 2-core machine may need more than 60 s to start
export RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S="${RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S:-600}"
# one machine, no preemptible nodes: no preemption watcher actor per training run
export RAY_TRAIN_ENABLE_PREEMPTION_WATCHER="${RAY_TRAIN_ENABLE_PREEMPTION_WATCHER:-0}"
address="http://127.0.0.1:8265"
started=0
if ! ray status >/dev/null 2>&1; then
  echo "starting a local Ray head (dashboard $address)"
  ray start --head --dashboard-host 127.0.0.1 --dashboard-port 8265 \
    --num-cpus "$(nproc)" --disable-usage-stats >/dev/null
  started=1
fi
stop_ray() {
  if [ "$started" = 1 ] && [ "${KEEP_RAY:-0}" != 1 ]; then
    echo "stopping the local Ray head (KEEP_RAY=1 keeps it)"
    ray stop >/dev/null 2>&1 || true
  fi
}
trap stop_ray EXIT
start=$(date +%s)
ray job submit --address "$address" --working-dir . -- \
  python jobs/train_all.py --profile "${PROFILE:-smoke}" "$@"
echo
echo "done in $(( $(date +%s) - start )) s."
echo "  Ray dashboard:  $address (jobs, actors, metrics; while the head runs: KEEP_RAY=1)"
echo "  MLflow UI:      .venv/bin/mlflow ui --backend-store-uri sqlite:///$PWD/mlflow.db"
echo "                  (or: make mlflow-server, then http://127.0.0.1:5000)"
echo "  results:        runs/<job name>/results.parquet and the tables in the parent run"
