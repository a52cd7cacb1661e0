#!/usr/bin/env bash
# Regenerate the figures of docs/benchmarks.md (docs/*.png) from fresh benchmark runs: a few minutes on 2 cores.
#
#   bash docs/make_figures.sh            # 2 ranks
#   bash docs/make_figures.sh 4          # 4 ranks (one core per rank, or the timings mean nothing)
#
# The dumps stay in build/figures/ (allreduce.h5, ddp.h5, scaling.h5) for the report's tables:
#   python benchmarks/report.py build/figures/*.h5 --no-plots
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-2}
dumps=build/figures
mkdir -p "$dumps"
./mpi_run.sh -n "$ranks" python benchmarks/allreduce.py -b 1K -e 64M -f 4 \
  --out "$dumps/allreduce.h5"
./mpi_run.sh -n "$ranks" python benchmarks/ddp.py --no-comm --backends mpi,ring,auto --syncs per_param,bucketed,overlap --bucket-mb 25 \
  --steps 10 --warmup 3 --out "$dumps/ddp.h5"
./mpi_run.sh -n "$ranks" python benchmarks/ddp.py --weak-scaling --no-comm --backends mpi,ring,auto --repeats 5 --steps 10 --warmup 3 \
  --out "$dumps/scaling.h5"
python benchmarks/report.py "$dumps/allreduce.h5" "$dumps/ddp.h5" "$dumps/scaling.h5" --outdir docs --dpi 60
