#!/usr/bin/env bash
# The embedded default: a local Ray head (dashboard on 127.0.0.1:8265, usage stats off), the
# main job submitted to it with `ray job submit` (logs followed), then where to look.
# PROFILE=quick|smoke|paper|FILE picks the profile (default quick), extra arguments go to
# jobs/train_all.py, KEEP_RAY=1 leaves the Ray head running afterwards. The terminal gets the
# job's own lines; Ray's logs stay in /tmp/ray/session_latest/logs (OPTW_RAY_TRAIN_LOG_LEVEL=INFO
# brings Ray Train's report lines back to the job's output).
set -euo pipefail
cd "$(dirname "$0")/.."
# The job's `python` is the one on the PATH of the process that starts the head.
export PATH="$PWD/.venv/bin:$PATH"
# Ray's defaults (usage stats off, token auth so that `ray job submit` sends the token too,
# worker start timeout, no preemption watcher) are written once, in optw/distributed/rayenv.py;
# a value already set wins. `ray start` needs the token to exist: it is made once (Ray's
# generator, never printed) and reused afterwards (optw/raylocal.py).
eval "$(python -m optw.distributed.rayenv)"
address="http://127.0.0.1:8265"
started=0
if ! ray status >/dev/null 2>&1; then
  python -m optw.raylocal
  echo "starting a local Ray head (dashboard $address)"
  ray start --head --dashboard-host 127.0.0.1 --dashboard-port 8265 \
    --num-cpus "$(nproc)" --disable-usage-stats >/dev/null
  started=1
fi
stop_ray() {
  if [ "$started" = 1 ] && [ "${KEEP_RAY:-0}" != 1 ]; then
    echo "stopping the local Ray head (KEEP_RAY=1 keeps it)"
    ray stop >/dev/null 2>&1 || true
  elif [ "$started" = 1 ]; then
    echo "leaving the local Ray head running (KEEP_RAY=1); stop it with: .venv/bin/ray stop"
  fi
}
trap stop_ray EXIT
start=$(date +%s)
# Quiet output: Ray's own messages stay in its log folder, the terminal gets the job's progress
# lines, warnings, errors and summary. The submission's messages go to optw-submit-<id>.log
# there, the job's whole output (Ray's lines included) to job-driver-<id>.log.
logs="${RAY_TMPDIR:-/tmp}/ray/session_latest/logs"
id="optw-$(date +%Y%m%d-%H%M%S)-$$"
if ! ray job submit --no-wait --submission-id "$id" --address "$address" --working-dir . \
    --log-style record --log-color false -- \
    python jobs/train_all.py --profile "${PROFILE:-quick}" "$@" >"$logs/optw-submit-$id.log" 2>&1
then
  cat "$logs/optw-submit-$id.log" >&2
  echo "the job could not be submitted (above; also in $logs/optw-submit-$id.log)" >&2
  exit 1
fi
# the submission's warnings still show (not the notes on what the upload leaves out)
grep -E '[[:space:]](WARNING|ERROR)[[:space:]]' "$logs/optw-submit-$id.log" \
  | grep -v 'is now ignored by default when packaging' >&2 || true
echo "job $id submitted; Ray's logs: $logs (this job's output: job-driver-$id.log)"
# Follow the job's output as `ray job submit` does, without the job manager's own lines; the
# exit status says whether the job succeeded.
python -m optw.distributed.follow "$address" "$id"
echo
echo "done in $(( $(date +%s) - start )) s."
echo "  Ray dashboard:  $address (jobs, actors, metrics; while the head runs: KEEP_RAY=1)"
# the store the job used: --tracking-uri among the arguments, else the environment's
tracking="${MLFLOW_TRACKING_URI:-}"
prev=""
for arg in "$@"; do
  case "$arg" in --tracking-uri=*) tracking="${arg#--tracking-uri=}" ;; esac
  [ "$prev" = "--tracking-uri" ] && tracking="$arg"
  prev="$arg"
done
case "$tracking" in
  http://*|https://*) echo "  MLflow UI:      $tracking" ;;
  *) echo "  MLflow UI:      .venv/bin/mlflow ui --backend-store-uri ${tracking:-sqlite:///$PWD/mlflow.db}"
     echo "                  (or: make mlflow-server, then http://127.0.0.1:5000)" ;;
esac
echo "  results:        runs/<job name>/results.parquet and the tables in the parent run"
