"""`python -m ringsnap.agent.s3`: run an export or a download on this node by hand.

    python -m ringsnap.agent.s3 export --settings s3.toml --backup ID --node NAME [--tag TAG] DATA_DIR...
    python -m ringsnap.agent.s3 download --settings s3.toml --backup ID --node NAME [--identity KEYFILE] DEST_DIR...

`--settings`: a TOML file of the `[s3]` settings (top level). `--identity`: a key file opening an
encrypted copy, as a restore's `--key-file` (age secret keys, `kms KEY [credentials]` lines sent to
the settings' KMS endpoint); read for this download only. Progress goes to stdout as JSON lines;
the coordinator drives the same functions through the agent.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.progress import Progress
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.config import load
from ringsnap.errors import RingsnapError


def _print_progress(progress: Progress) -> None:
    line = asdict(progress) | {
        "rate_bytes_per_second": round(progress.rate_bytes_per_second),
        "eta_seconds": progress.eta_seconds,
    }
    print(json.dumps({"progress": line}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ringsnap.agent.s3", description=__doc__)
    parser.add_argument("action", choices=("export", "download"))
    parser.add_argument("--settings", type=Path, required=True)
    parser.add_argument("--backup", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--tag", default="", help="native snapshot tag to export (export only)")
    parser.add_argument(
        "--identity",
        type=Path,
        help="key file of an encrypted copy: age keys, kms lines (download only)",
    )
    parser.add_argument("directories", nargs="+", type=Path)
    args = parser.parse_args(argv)
    try:
        settings = load(args.settings, S3Settings)
        client = make_client(settings)
        # Each action imports only its own engine: a process started for one download (by hand,
        # or by the benchmark that times it) does not load the export's.
        result: Any
        if args.action == "export":
            from ringsnap.agent.manifest import manifest
            from ringsnap.agent.s3.export import export_node

            roots = args.directories
            result = export_node(
                client,
                settings,
                backup_id=args.backup,
                node=args.node,
                data_directories=roots,
                manifest=lambda: manifest(roots, tag=args.tag),
                progress=_print_progress,
            )
        else:
            from ringsnap.agent.s3.crypto.key_file import key_file_identities
            from ringsnap.agent.s3.crypto.recipients import Identity, WrapError
            from ringsnap.agent.s3.download import download_node

            identities: list[Identity] = []
            if args.identity is not None:
                try:
                    identities = key_file_identities(
                        args.identity.read_text(), str(args.identity), settings.encryption
                    )
                except (OSError, UnicodeDecodeError, WrapError) as exc:
                    print(f"error: --identity {args.identity}: {exc}", file=sys.stderr)
                    return 1
            result = download_node(
                client,
                settings,
                backup_id=args.backup,
                node=args.node,
                destinations=args.directories,
                progress=_print_progress,
                identities=identities,
            )
    except RingsnapError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"result": asdict(result)}, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
