"""``ray-wandb-nodes``: report on and sync the offline runs of ray_wandb_nodes.

    ray-wandb-nodes report FOLDER [--png FILE] [--json]
    ray-wandb-nodes sync FOLDER [--dry-run] [--entity E] [--project P]

FOLDER is an offline run folder (``<dir>/ray_wandb_nodes/<run id>``, with ``index.json``),
a folder of them, or any folder of wandb ``.wandb`` files. Exit status: 0 when all went
well, 1 when some file is damaged or some upload failed (everything else is still reported
or uploaded), 2 when nothing could be done (no such folder, no runs, not logged in).
"""

from __future__ import annotations

import argparse
import json
import sys

from . import __version__


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ray-wandb-nodes",
        description="Report on and sync the offline W&B runs of ray_wandb_nodes (every node of a Ray run).",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("report", help="per-node summary: samples, CPU, memory, GPU, network; outliers flagged")
    r.add_argument("folder", help="an offline run folder, a folder of them, or any folder of .wandb files")
    r.add_argument("--png", metavar="FILE", help="also draw one line per node for the main metrics (needs matplotlib)")
    r.add_argument("--json", action="store_true", help="print the same numbers as JSON")
    s = sub.add_parser("sync", help="upload the primary's run, then every node's, into the one W&B run")
    s.add_argument("folder", help="an offline run folder, or a folder of them")
    s.add_argument("--dry-run", action="store_true", help="say what would be uploaded, upload nothing")
    s.add_argument("--entity", help="upload to this entity instead of the one the run recorded")
    s.add_argument("--project", help="upload to this project instead of the one the run recorded")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "report":
            return _report(args)
        return _sync(args)
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f"ray-wandb-nodes {args.command}: {e}", file=sys.stderr)
        return 2


def _report(args: argparse.Namespace) -> int:
    from .report import format_text, load, to_json, write_png

    reports = load(args.folder)
    if args.json:
        print(json.dumps(to_json(reports), indent=2, default=str))
    else:
        print(format_text(reports), end="")
    if args.png:
        for path in write_png(reports, args.png):
            print(f"Chart written: {path}", file=sys.stderr if args.json else sys.stdout)
    return 1 if any(r.errors for r in reports) else 0


def _sync(args: argparse.Namespace) -> int:
    from .report.sync import logged_in, plan, sync

    steps, absent = plan(args.folder)
    for w in absent:
        where = f"; its data is at {w['source']}" if w.get("source") else ""
        print(f"note: {w.get('label')} is not in this folder ({w.get('state')}: {w.get('error')}{where})")
    if not steps:
        print(f"ray-wandb-nodes sync: no .wandb files in {args.folder!r}", file=sys.stderr)
        return 2
    ok, where = logged_in()
    if not ok:
        message = (
            f"not logged in to {where}: run `wandb login` (or set WANDB_API_KEY) on this machine, then run this again"
        )
        if not args.dry_run:
            print(f"ray-wandb-nodes sync: {message}", file=sys.stderr)
            return 2
        print(f"note: {message}")
    return sync(steps, entity=args.entity, project=args.project, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
