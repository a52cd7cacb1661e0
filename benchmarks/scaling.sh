#!/usr/bin/env bash
# The scaling matrix on one many-core node: every backend's all-reduce sweep and the DDP step
# against both ceilings, at every rank count.  Run with --help for usage.
set -uo pipefail

usage() {
  cat <<'USAGE'
Usage: benchmarks/scaling.sh [--ranks LIST] [--out DIR] [--threads K] [--quick]

For every rank count N in LIST (default: 1, 2, 4, 8, 16, and the CPU count if it is another),
skipping any N above this machine's CPUs (oversubscribed ranks say nothing of speed):

  1. allreduce-nN.h5: the all-reduce sweep, every backend, both buffer placements
     (benchmarks/allreduce.py --buffers both -b 1K -e 64M -f 8); N >= 2 only;
  2. ddp-nN-caller.h5 and ddp-nN-thread.h5: the DDP step of the MLP 784-1024x3-10, batch 128 per
     rank, overlap, backends auto and mpi, against npddp's no-comm step and the bare-NumPy step
     (benchmarks/ddp.py --no-comm --bare), with all-reduces driven by the caller and by a
     progress thread (which can use a core no rank computes on);

then report.txt: benchmarks/report.py's tables over every dump.  Each step prints one line with
its time; a step that fails is named and the rest still run; the exit status is 1 if any failed.

  --ranks LIST   comma-separated rank counts (default 1,2,4,8,16 and the CPU count)
  --out DIR      where the dumps, logs and report go (default scaling-<date>)
  --threads K    BLAS threads per rank (default 1, as every figure in docs/ is taken)
  --quick        a few sizes and steps: checks the script, not the machine
  -h, --help     show this help
USAGE
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
ranks="" out="" threads=1 quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks="${2:?--ranks needs a list, e.g. 2,4}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --threads) threads="${2:?--threads needs a count}"; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "scaling.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
cpus="$(python -c 'import os; print(len(os.sched_getaffinity(0)))')"
ranks="${ranks:-1,2,4,8,16,$cpus}"
if ! [[ "$ranks" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
  echo "scaling.sh: --ranks '$ranks' is not a comma-separated list of counts, e.g. 1,2,4" >&2; exit 2
fi
if ! [[ "$threads" =~ ^[1-9][0-9]*$ ]]; then
  echo "scaling.sh: --threads '$threads' is not a count >= 1" >&2; exit 2
fi
out="${out:-scaling-$(date -u +%Y%m%dT%H%M%S)}"
mkdir -p "$out" || exit 2

if [ "$quick" = 1 ]; then
  sweep=(-b 1K -e 64K -f 8 --iters 3 --warmup 1 --budget 0.05)
  steps=(--steps 4 --rounds 2 --warmup 1)
else
  sweep=(-b 1K -e 64M -f 8 --budget 0.25)
  steps=(--steps 40 --rounds 10 --warmup 3)
fi
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads"
failed=()

step() {  # step NAME LOG COMMAND...: run one step, print its time, note a failure
  local name="$1" log="$2"; shift 2
  local t0=$SECONDS
  if "$@" >"$log" 2>&1; then
    echo "  $name: done in $((SECONDS - t0)) s ($log)"
  else
    echo "  $name: FAILED after $((SECONDS - t0)) s, see $log"; failed+=("$name")
  fi
}

echo "scaling matrix: ranks $ranks on $cpus CPUs, $threads BLAS thread(s) per rank, into $out/"
for n in $(echo "$ranks" | tr , '\n' | sort -n | uniq); do
  if [ "$n" -lt 1 ] || [ "$n" -gt "$cpus" ]; then
    echo "N = $n: skipped (valid: 1..$cpus, the CPUs of this machine)"; continue
  fi
  echo "N = $n"
  if [ "$n" -ge 2 ]; then
    step "allreduce N=$n" "$out/allreduce-n$n.log" "$root/mpi_run.sh" -n "$n" python "$here/allreduce.py" \
      --buffers both "${sweep[@]}" --out "$out/allreduce-n$n.h5"
  fi
  for progress in caller thread; do
    step "ddp N=$n $progress" "$out/ddp-n$n-$progress.log" "$root/mpi_run.sh" -n "$n" python "$here/ddp.py" \
      --models base --batch 128 --syncs overlap --backends auto,mpi --bucket-mb 4,25 --no-comm --bare \
      --progress "$progress" "${steps[@]}" --out "$out/ddp-n$n-$progress.h5"
  done
done

dumps=("$out"/*.h5)
if [ -e "${dumps[0]}" ]; then
  step "report" "$out/report.txt" python "$here/report.py" --no-plots "${dumps[@]}"
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}"; exit 1
fi
echo "all steps done: $out/report.txt"
