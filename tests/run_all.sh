#!/usr/bin/env bash
# The whole test suite: serial tests; the DDP tests on one rank; the distributed tests under mpirun at
# 2, 3 and 4 ranks (the benchmark scripts' at 2); the communicator tests over TCP (python -m npddp.run, no MPI) at 2, 3 and 4 ranks;
# and hier and auto (which composes hier there) across pretended nodes (NPDDP_RANKS_PER_NODE=2, 4 ranks) on both transports.
# Exits non-zero if any run fails.  Extra arguments go to every pytest run.
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
TCP_TESTS=(tests/comm tests/reliability/test_timeouts.py tests/reliability/test_mismatch.py)
TCP_TESTS+=(tests/parallel/test_zero.py)   # ZeRO stages equal DDP over TCP too
failed=()
run() {  # run NAME COMMAND...: one run, its name recorded if it fails
  local name=$1; shift
  echo "=== $name: $*"
  timeout 600 "$@" || failed+=("$name")
}
run serial python -m pytest -q -m "not mpi" "$@"
run mpi-1 python -m pytest -q --with-mpi -m mpi tests/parallel/test_ddp.py -k "not overlap_starts and not mismatched" "$@"
run mpi-2 ./mpi_run.sh -n 2 python -m pytest -q --with-mpi -m mpi "$@"
for k in 3 4; do  # the benchmark scripts' own tests run at N = 2 only
  run "mpi-$k" ./mpi_run.sh -n "$k" python -m pytest -q --with-mpi -m mpi --ignore=tests/benchmarks "$@"
done
for k in 2 3 4; do
  run "tcp-$k" python -m npddp.run --nproc "$k" -m pytest -q -p no:pytest_mpi "${TCP_TESTS[@]}" "$@"
done
NPDDP_RANKS_PER_NODE=2 run hier-mpi-4 ./mpi_run.sh -n 4 python -m pytest -q --with-mpi -m mpi -k "hier or auto" tests/comm "$@"
NPDDP_RANKS_PER_NODE=2 run hier-tcp-4 python -m npddp.run --nproc 4 -m pytest -q -p no:pytest_mpi -k "hier or auto" tests/comm "$@"
# The comm contract across emulated nodes (python -m npddp.cluster; needs CAP_NET_ADMIN, else skipped with the
# reason): every backend but shm (hier included) at N = 2 (2 nodes x 1), 3 (3 x 1) and 4 (2 x 2) on both transports.
CLUSTER_K=(-q -k "allreduce_exact and not shm-backend" tests/comm/test_comm_allreduce.py)
if why=$(python -c "from tests.cluster.conftest import WHY_NOT; print(WHY_NOT or '')") && [[ -z "$why" ]]; then
  for shape in "2 1" "3 1" "2 2"; do
    read -r nodes per <<< "$shape"
    up=(python -m npddp.cluster --nodes "$nodes" --ranks-per-node "$per" --rate none)
    run "cluster-tcp-${nodes}x$per" "${up[@]}" --launcher tcp -- python -m pytest -p no:pytest_mpi "${CLUSTER_K[@]}" "$@"
    run "cluster-mpi-${nodes}x$per" "${up[@]}" --launcher mpi -- python -m pytest --with-mpi -m mpi "${CLUSTER_K[@]}" "$@"
  done
else
  echo "=== cluster runs skipped: emulated nodes unavailable: $why"
fi
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "FAILED runs: ${failed[*]}"
  exit 1
fi
echo "all runs passed: serial, mpi-1 (DDP), mpi-2/3/4, tcp-2/3/4, hier-mpi-4, hier-tcp-4, cluster-{tcp,mpi}-{2x1,3x1,2x2}"
