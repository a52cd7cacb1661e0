#!/usr/bin/env bash
# Launch an MPI job with sane per-rank defaults.  Run with --help for usage.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: ./mpi_run.sh [-n N] [--hostfile FILE] [--max-restarts K] [--dry-run] [--] COMMAND [ARGS...]

Runs COMMAND on N MPI ranks (default 2) with the mpirun of the active environment
(the virtual environment's bin/ first, then PATH).

  -n, -np N         number of ranks (default: 2)
  --hostfile FILE   hosts to place ranks on (passed as -f for MPICH and Intel MPI, --hostfile for Open MPI)
  --max-restarts K  when the job fails, run it again, at most K times (default: 0); each run
                    sees NPDDP_RESTART_COUNT (0, 1, ...), so `python -m npddp.train
                    --checkpoint c.h5 --resume auto` continues from its last checkpoint.
                    Exit status 2 (bad flags or files: it would fail again) is not restarted.
  --dry-run         print the mpirun command line and exit without running it
  -h, --help        show this help

Environment:
  Each rank gets its share of this machine's CPUs as BLAS/OpenMP threads
  (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS = CPUs / N, at least 1, as
  `python -m npddp.util.threads --ranks N` computes it) unless you already set them: ranks
  sharing cores otherwise fight over them.  With --hostfile nothing is exported: npddp's
  entry points apply the same rule inside each rank, per node (--threads auto).

MPI libraries (MPICH, Open MPI, Intel MPI; see docs/guide/launching.md, "Every MPI"):
  The library is told by the launcher's name (prterun) or its --version text. Open MPI gets
  --oversubscribe (and --allow-run-as-root when running as root), its --hostfile and -x VAR;
  MPICH and Intel MPI get -f FILE and -envlist. Intel MPI's mpirun is a shell script that passes
  no signal to the mpiexec it runs: its mpiexec (beside it) runs the job instead. The launcher's
  directory goes first on PATH (Intel MPI's mpirun needs its mpiexec.hydra there).
  MPIRUN=/path/to/mpirun overrides the launcher lookup.  The full command is printed to
  stderr before it runs.

Shared memory:
  The job runs under `python -m npddp.process.cleanup run`, which notes the /dev/shm segments the
  job's processes map; if the job ends abnormally (an MPI_Abort, a kill), those left
  behind are removed (only this job's, on this node).  NPDDP_SHM_WATCH=0 turns it off.
  After a bare mpirun: `python -m npddp.process.cleanup clean` removes your orphaned segments.

Stopping:
  The job runs under `python -m npddp.process.supervise`, which takes this script's pid:
  SIGINT/SIGTERM/SIGHUP to that pid stop mpirun and its ranks within seconds (mpirun gets
  SIGKILL 5 s after the signal if it is still there) and are never followed by a restart;
  a SIGKILL of that pid makes mpirun stop its ranks too. Where npddp cannot be imported, the
  script runs mpirun itself, with -n and -hostfile only (no library's flags): SIGINT/SIGTERM still
  stop it, but after a SIGKILL of the script kill the job's process group instead (kill -- -PGID).

Examples:
  ./mpi_run.sh -n 4 python -m npddp.train --backend ring
  ./mpi_run.sh -n 2 python benchmarks/allreduce.py --out ar.h5
USAGE
}

nprocs=2
hostfile=""
dry_run=0
max_restarts=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    -n|-np) [[ $# -ge 2 ]] || { echo "mpi_run.sh: $1 needs a value" >&2; exit 2; }
            nprocs="$2"; shift 2 ;;
    --hostfile) [[ $# -ge 2 ]] || { echo "mpi_run.sh: --hostfile needs a file" >&2; exit 2; }
            hostfile="$2"; shift 2 ;;
    --max-restarts) [[ $# -ge 2 ]] || { echo "mpi_run.sh: --max-restarts needs a value" >&2; exit 2; }
            max_restarts="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --) shift; break ;;
    -*) echo "mpi_run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[[ $# -gt 0 ]] || { echo "mpi_run.sh: no command given (see --help)" >&2; exit 2; }
[[ "$nprocs" =~ ^[1-9][0-9]*$ ]] || { echo "mpi_run.sh: -n must be a positive integer, got '$nprocs'" >&2; exit 2; }
[[ "$max_restarts" =~ ^[0-9]+$ ]] || { echo "mpi_run.sh: --max-restarts must be an integer >= 0, got '$max_restarts'" >&2; exit 2; }
[[ -z "$hostfile" || -r "$hostfile" ]] || { echo "mpi_run.sh: hostfile '$hostfile' is not readable" >&2; exit 2; }

mpirun="${MPIRUN:-}"
if [[ -z "$mpirun" && -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/mpirun" ]]; then mpirun="$VIRTUAL_ENV/bin/mpirun"; fi
if [[ -z "$mpirun" ]]; then
  pydir="$(dirname "$(command -v python3 || command -v python || echo /nonexistent)")"
  if [[ -x "$pydir/mpirun" ]]; then mpirun="$pydir/mpirun"; fi
fi
if [[ -z "$mpirun" ]]; then mpirun="$(command -v mpirun || command -v mpiexec || true)"; fi
[[ -n "$mpirun" ]] || { echo "mpi_run.sh: no mpirun found; pip install mpich (or install an MPI) first" >&2; exit 127; }

python="$(command -v python3 || command -v python || true)"
npddp_ok=0
if [[ -n "$python" ]] && "$python" -c "import npddp.util.threads, npddp.process.cleanup" 2>/dev/null; then npddp_ok=1; fi
# BLAS threads per rank: this machine's CPUs / N (npddp's auto rule), unless already chosen. With a
# hostfile the ranks per node are not known here: npddp's entry points then apply the rule per node.
if [[ -z "$hostfile" ]]; then
  threads=1
  if [[ "$npddp_ok" == 1 ]]; then threads="$("$python" -m npddp.util.threads --ranks "$nprocs")"; fi
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}"
  export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-$threads}"
  export MKL_NUM_THREADS="${MKL_NUM_THREADS:-$threads}"
fi

# The launcher's flags come from npddp's table of MPI libraries (npddp/util/mpilibs.py): Open MPI gets
# --oversubscribe (and --allow-run-as-root as root), each library its hostfile flag and its way to pass variables.
exported=()
for v in OMP_NUM_THREADS OPENBLAS_NUM_THREADS MKL_NUM_THREADS; do [[ -n "${!v:-}" ]] && exported+=("$v"); done
exported+=(NPDDP_RESTART_COUNT)
if [[ "$npddp_ok" == 1 ]]; then
  flags="$("$python" -m npddp.process.launchflags --mpirun "$mpirun" -n "$nprocs" ${hostfile:+--hostfile "$hostfile"} \
           --export "${exported[@]}")" || exit 2
  mapfile -t args <<< "$flags"
  mpirun="${args[0]}"; args=("${args[@]:1}")    # Intel MPI: its mpiexec in place of its mpirun script
else
  args=(-n "$nprocs"); [[ -n "$hostfile" ]] && args+=(-hostfile "$hostfile")   # understood by every library
fi
# Intel MPI's mpirun runs mpiexec.hydra from PATH: the launcher's own directory goes first.
PATH="$(dirname "$mpirun"):$PATH"; export PATH

echo "+ $mpirun ${args[*]} $*" >&2
[[ "$dry_run" == 1 ]] && exit 0
export NPDDP_RESTART_COUNT=0
if [[ "$npddp_ok" == 1 ]]; then
  watch=(); [[ "${NPDDP_SHM_WATCH:-1}" == 0 ]] && watch=(--no-watch)
  exec "$python" -m npddp.process.supervise --max-restarts "$max_restarts" ${watch[@]+"${watch[@]}"} -- "$mpirun" "${args[@]}" "$@"
fi
if [[ "$max_restarts" == 0 ]]; then exec "$mpirun" "${args[@]}" "$@"; fi
# Without npddp (plain bash): mpirun runs in the background so that a signal stops it at once.
child=""
stop() { [[ -n "$child" ]] && kill "-$1" "$child" 2>/dev/null; wait "$child" 2>/dev/null; exit "$2"; }
trap 'stop INT 130' INT
trap 'stop TERM 143' TERM
while :; do
  status=0
  "$mpirun" "${args[@]}" "$@" & child=$!
  wait "$child" || status=$?
  if [[ "$status" == 0 || "$status" == 2 || "$NPDDP_RESTART_COUNT" -ge "$max_restarts" ]]; then
    [[ "$status" != 0 ]] && echo "mpi_run.sh: the job failed (exit $status) after $NPDDP_RESTART_COUNT restart(s); giving up" >&2
    exit "$status"
  fi
  NPDDP_RESTART_COUNT=$((NPDDP_RESTART_COUNT + 1))
  echo "mpi_run.sh: the job failed (exit $status); restarting every rank ($NPDDP_RESTART_COUNT of $max_restarts, NPDDP_RESTART_COUNT=$NPDDP_RESTART_COUNT)" >&2
done
