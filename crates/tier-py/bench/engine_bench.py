"""What the engine benchmarks share: the workload's size and the kvtier NIXL FILE settings they
can vary."""

from __future__ import annotations

import argparse
import statistics


def parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every engine benchmark takes."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--chunk-mib", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--page-checksum", choices=["crc32c", "off"], default=None,
                    help="kvtier's NIXL FILE page checksum (default: the tier's, crc32c)")
    ap.add_argument("--direct-io", action="store_true",
                    help="kvtier's NIXL FILE with direct_io = \"preferred\" (as vLLM's fs tier uses O_DIRECT)")
    ap.add_argument("--engine", choices=["nixl", "syscalls"], default=None,
                    help="kvtier's NIXL FILE engine (default: the tier's, nixl)")
    ap.add_argument("--lanes", type=int, default=None,
                    help="kvtier's NIXL FILE lanes (staging_buffers; default: the tier's default, 2)")
    return ap


def tier_tuning(args: argparse.Namespace) -> dict:
    """The NIXL FILE tier settings the arguments ask for."""
    tuning: dict = {}
    if args.lanes is not None:
        tuning["staging_buffers"] = args.lanes
    if args.direct_io:
        tuning["direct_io"] = "preferred"
    if args.page_checksum:
        tuning["page_checksum"] = args.page_checksum
    if args.engine:
        tuning["engine"] = args.engine
    return tuning


def load_figures(times: dict[str, list[float]], cpu: dict[str, list[float]],
                 nbytes: int) -> dict[str, tuple[float, float, float]]:
    """Per load: its median rate (bytes a second), its median CPU (seconds, every thread of
    the process) and the cores it kept busy (mean CPU over mean time)."""
    return {name: (nbytes / statistics.median(ts), statistics.median(cpu[name]),
                   statistics.mean(cpu[name]) / statistics.mean(ts))
            for name, ts in times.items()}
