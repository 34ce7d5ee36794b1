"""Print the CRD manifests, or write them into a directory (crds/ in the repository)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flotilla.resources import crds

HELP = "Print or write the CRD manifests"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--write", metavar="DIR", type=Path, help="write one YAML file per CRD into DIR")


def run(args: argparse.Namespace) -> int:
    if args.write:
        for path in crds.write_all(args.write):
            print(path)
        return 0
    sys.stdout.write("---\n".join(crds.render(make) for make in crds.CRDS.values()))
    return 0
