"""``python -m tests.fuzz``: run random programs on every backend over MPI and TCP until time is up; report findings.

Each job draws its programs from ``--seed`` and its own number, so ``--seed K --job J`` runs job J
again exactly, and ``--program SEED ...`` runs one program alone; every finding prints both.
Exit status: 0 when nothing but known or documented cases came up, 1 on a finding, 2 on bad flags.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter

from npddp.comm import BACKENDS

from tests.fuzz import jobs, known
from tests.fuzz.judge import SLOW_S, judge
from tests.fuzz.program import generate

TRANSPORTS = ("mpi", "tcp")
NPROCS = (2, 3, 4)


def _csv(kind, valid):
    def parse(text):
        items = [kind(t) for t in text.split(",") if t]
        bad = [t for t in items if t not in valid]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{text!r}: valid values are {', '.join(map(str, valid))}")
        return tuple(items)
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="stop starting jobs after this long (default: 60)")
    p.add_argument("--seed", type=int, default=0, help="the run's seed: every job's programs derive from it")
    p.add_argument("--backends", type=_csv(str, BACKENDS), default=BACKENDS, help="comma-separated (default: all)")
    p.add_argument("--nproc", type=_csv(int, (1, 2, 3, 4, 5, 6, 7, 8)), default=NPROCS, help="rank counts (2,3,4)")
    p.add_argument("--transport", type=_csv(str, TRANSPORTS), default=TRANSPORTS, help="mpi,tcp (default: both)")
    p.add_argument("--programs", type=int, default=16, help="programs per job (default: 16)")
    p.add_argument("--perturb", choices=("mix", "on", "off"), default="mix",
                   help="perturb one rank's arguments in half of the programs, all, or none")
    p.add_argument("--timeout", type=float, default=10.0, help="NPDDP_TIMEOUT of the jobs, seconds (default: 10)")
    p.add_argument("--slow", type=float, default=SLOW_S,
                   help=f"a mismatch error later than this after its call started is a finding (default: {SLOW_S:g} s)")
    p.add_argument("--known-open", choices=("skip", "allow", "fail"), default="skip",
                   help="programs covered by KNOWN_OPEN: not run (default), run and reported as known, or run as "
                        "any other (fail on them)")
    p.add_argument("--limits", choices=("skip", "allow"), default="skip",
                   help="programs the docs say end in the timeout (LIMITS): not run (default) or run")
    p.add_argument("--job", type=int, help="run only this job of --seed (as a finding's reproducer prints it)")
    p.add_argument("--program", type=int, help="run only this program seed (with one --backends, --nproc, "
                                               "--transport); --perturb on or off")
    p.add_argument("--max-jobs", type=int, default=0, help="stop after this many jobs (0: no limit)")
    p.add_argument("--same-job", action="store_true",
                   help="go on in the same job after a program ends in another error than the mismatch (by default "
                        "a fresh job runs the rest): finds what one failure leaves behind for the next communicator")
    p.add_argument("--no-confirm", dest="confirm", action="store_false",
                   help="do not run a failing program again alone to see whether it fails by itself")
    p.add_argument("-q", "--quiet", action="store_true", help="print findings and the summary only")
    return p


def _job_plan(args, number: int):
    """Job ``number`` of the run: its transport, rank count, and programs ``[seed, backend, perturbed]``."""
    rng = random.Random(f"{args.seed}:{number}")
    configs = [(t, n) for t in args.transport for n in args.nproc if not (t == "tcp" and args.backends == ("mpi",))]
    transport, nproc = configs[number % len(configs)]
    backends = [b for b in args.backends if not (transport == "tcp" and b == "mpi")]
    programs = []
    while len(programs) < args.programs:
        perturbed = {"on": True, "off": False}.get(args.perturb, rng.random() < 0.5)
        entry = [rng.getrandbits(40), backends[len(programs) % len(backends)], perturbed]
        program = generate(entry[0], nproc, entry[1], entry[2])
        if args.known_open == "skip" and known.matching(known.KNOWN_OPEN, program, transport):
            continue
        if args.limits == "skip" and known.matching(known.LIMITS, program, transport):
            continue
        programs.append(entry)
    return transport, nproc, programs


def _reproducer(args, transport, nproc, entry, number=None) -> str:
    seed, backend, perturbed = entry
    flags = f"--nproc {nproc} --transport {transport} --timeout {args.timeout:g}"
    one = f"python -m tests.fuzz --program {seed} --backends {backend} {flags} --perturb {'on' if perturbed else 'off'}"
    if number is None:
        return one
    return (f"{one}   (in its job: python -m tests.fuzz --seed {args.seed} --job {number} {flags} --programs "
            f"{args.programs} --backends {','.join(args.backends)} --perturb {args.perturb} "
            f"--known-open {args.known_open} --limits {args.limits}{' --same-job' if args.same_job else ''})")


def _ends(program, files) -> str:
    """How each rank ended: ``0 ok``, ``1 TimeoutError@3`` (the exception and the op index), ``2 -`` (no file)."""
    parts = []
    for rank in range(program.size):
        data = files.get(rank)
        e = None if data is None else data["error"]
        parts.append(f"{rank} " + ("-" if data is None else "ok" if e is None else f"{e['type']}@{e['index']}"))
    return ", ".join(parts)


def _verdict(args, transport, program, files, missing):
    verdict = judge(program, transport, files, missing, args.slow)
    if verdict.outcome == "known" and args.known_open == "fail":
        return verdict.__class__("finding", verdict.cls, verdict.detail, verdict.rule)
    return verdict


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    outcomes, per_config, findings = Counter(), Counter(), []
    began = time.monotonic()
    wall = 2 * args.timeout + 20
    if args.program is not None:
        if len(args.backends) != 1 or len(args.nproc) != 1 or len(args.transport) != 1 or args.perturb == "mix":
            print("--program needs one --backends, one --nproc, one --transport and --perturb on or off", file=sys.stderr)
            return 2
        plans = [(None, args.transport[0], args.nproc[0], [[args.program, args.backends[0], args.perturb == "on"]])]
    elif args.job is not None:
        plans = [(args.job, *_job_plan(args, args.job))]
    else:
        plans = None
    number = 0
    while True:
        if plans is not None:
            if not plans:
                break
            job, transport, nproc, programs = plans.pop(0)
        else:
            if time.monotonic() - began > args.seconds or (args.max_jobs and number >= args.max_jobs):
                break
            job, (transport, nproc, programs) = number, _job_plan(args, number)
            number += 1
        started = time.monotonic()
        results = jobs.run(transport, nproc, programs, args.timeout, wall, log=say, fresh=not args.same_job)
        tally = Counter()
        for entry, (files, missing) in zip(programs, results):
            program = generate(entry[0], nproc, entry[1], entry[2])
            verdict = _verdict(args, transport, program, files, missing)
            tally[verdict.outcome] += 1
            outcomes[verdict.outcome] += 1
            per_config[(transport, nproc)] += 1
            if verdict.outcome in ("finding", "known"):
                line = (f"{verdict.outcome.upper()} {verdict.cls}{' [' + verdict.rule + ']' if verdict.rule else ''} "
                        f"{transport} N={nproc} {entry[1]} ({program.mode}): {verdict.detail}\n  ranks: {_ends(program, files)}"
                        f"\n  reproduce: "
                        f"{_reproducer(args, transport, nproc, entry, job)}")
                if verdict.failed and args.confirm and len(programs) > 1:
                    files, missing = jobs.run(transport, nproc, [entry], args.timeout, wall)[0]
                    again = _verdict(args, transport, program, files, missing)
                    line += f"\n  alone: {again.outcome} {again.cls} {again.detail[:120]}"
                if verdict.failed:
                    findings.append(line)
                    print(line, flush=True)
                else:
                    say(line)
        say(f"job {job if job is not None else '-'}: {transport} N={nproc}, {len(programs)} programs in "
            f"{time.monotonic() - started:.1f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    total = sum(outcomes.values())
    print(f"fuzz: {total} programs in {time.monotonic() - began:.0f} s (seed {args.seed}); "
          + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) + "; by transport and N: "
          + ", ".join(f"{t}-{n} {c}" for (t, n), c in sorted(per_config.items())), flush=True)
    print(f"fuzz: {len(findings)} finding(s)" + ("" if not findings else ":\n" + "\n".join(findings)), flush=True)
    return 1 if findings else 0
