"""What the communication tools' command lines share: ``--plugin`` modules loaded, ``--transport`` checked."""

from __future__ import annotations

import argparse

from npddp.comm import transport_names
from npddp.util import plugins


def load_plugins_and_check_transport(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Import ``args.plugin`` (they may register transports), then refuse an unknown ``args.transport`` via ``parser``."""
    try:
        plugins.load(args.plugin)
    except ValueError as exc:
        parser.error(str(exc))
    if args.transport not in ("auto", *transport_names()):
        parser.error(f"--transport {args.transport!r} is unknown; valid: auto, {', '.join(transport_names())} "
                     "(a transport of your own: --plugin MODULE)")
