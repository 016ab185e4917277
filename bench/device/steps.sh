# Sourced by the device rounds (round4.sh, round5.sh): from the repository root, results
# under $OUT, one deadline for the whole call ($BUDGET_S seconds from now, default the
# round's own `budget`, set before sourcing).
#   pick REHEARSAL DEVICE   the first value in a rehearsal (REHEARSE=1), else the second
#   step CMD...             CMD, run only with 20 s left, stopped (with its children) at
#                           the deadline; what ended it goes to $OUT/run.log
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export OUT=${OUT:-/tmp/simjoin-device-out}
mkdir -p "$OUT"
deadline=$(($(date +%s) + ${BUDGET_S:-$budget}))
run=bench/device/run.sh
pick() { if [ -n "${REHEARSE:-}" ]; then echo "$1"; else echo "$2"; fi; }
step() {
  local left=$((deadline - $(date +%s)))
  if [ $left -lt 20 ]; then echo "== skipped (deadline): $*" | tee -a "$OUT/run.log"; return; fi
  timeout -k 5 $left "$@" || echo "== step ended rc=$? ($((deadline - $(date +%s))) s left): $*" | tee -a "$OUT/run.log"
}
