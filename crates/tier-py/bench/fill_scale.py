"""What a big fill through the Python `Store` costs: N pages of 4 KiB under 64-hex keys are put
into one NIXL FILE folder (the tier's defaults: its policy, checksums, engine) in batches, and it
prints the put rate of each tenth of the fill, the last tenth's against the first, and the
process's RSS grown from before the open to after the fill, per page stored. The RSS is read
as it is, with nothing handed back to the system first: what the fill leaves in the allocator
counts.

    python crates/tier-py/bench/fill_scale.py --pages 1000000 [--engine nixl|syscalls]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import kvtier

PAGE = 4096


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pages", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument(
        "--engine",
        choices=["nixl", "syscalls"],
        default=None,
        help="the NIXL FILE tier's I/O engine (default: the tier's)",
    )
    ap.add_argument("--policy", default=None, help="the tier's policy (default: the tier's)")
    ap.add_argument(
        "--ordered-pages",
        type=int,
        default=None,
        help="pages the index keeps in exact order (default: the tier's)",
    )
    ap.add_argument("--dir", default=None, help="where the folder goes (default: a temp dir)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        tier: dict = {"kind": "nixl-file", "dirs": [root]}
        if args.engine:
            tier["engine"] = args.engine
        if args.policy:
            tier["policy"] = args.policy
        if args.ordered_pages is not None:
            tier["ordered_pages"] = args.ordered_pages
        payload = bytes(range(256)) * (PAGE // 256)
        before = rss_bytes()
        rates = []
        with kvtier.Store({"tiers": [tier]}) as store:
            opened = rss_bytes()
            tenth = args.pages // 10
            done = 0
            for part in range(10):
                end = args.pages if part == 9 else done + tenth
                t0 = time.perf_counter()
                while done < end:
                    n = min(args.batch, end - done)
                    keys = [f"{i:064x}" for i in range(done, done + n)]
                    results = store.put(keys, [payload] * n)
                    failed = [r for r in results if r is not None]
                    if failed:
                        raise SystemExit(f"put failed: {failed[0]!r}")
                    done += n
                rates.append((end - part * tenth) / (time.perf_counter() - t0))
            filled = rss_bytes()
        print(
            f"{args.pages:,} pages of {PAGE} B, batches of {args.batch}, "
            f"engine {args.engine or 'default'}, policy {args.policy or 'default'}"
        )
        print("put rate per tenth (pages/s): " + ", ".join(f"{r:,.0f}" for r in rates))
        print(f"last tenth / first: {rates[-1] / rates[0]:.2f}x")
        print(
            f"RSS: open +{(opened - before) / 2**20:.1f} MiB; "
            f"fill +{(filled - opened) / 2**20:.1f} MiB; "
            f"per page {(filled - before) / args.pages:.1f} B from before the open, "
            f"{(filled - opened) / args.pages:.1f} B from after it"
        )


if __name__ == "__main__":
    main()
