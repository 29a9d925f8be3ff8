"""Bytes a Curvine Worker logs per L2 chunk file, modelled from Curvine v0.3.2-alpha's source.

At INFO a Worker logs two lines for every block it opens for reading and two for every block it
writes. An L2 chunk file is one Curvine block (a 256-token chunk of Qwen2-7B is 14 MiB, below
the client's 128 MB block size), so every chunk LMCache stores or reads back costs the Worker that
holds it two lines. This module renders those lines as the Worker prints them and counts their
bytes, for docs/l2-cache.md ("Curvine's servers: SIGTERM and logs"); the Workers run at
:data:`k8s.curvine_config.WORKER_LOG_LEVEL` (WARN), which drops them.

The lines (CurvineIO/curvine v0.3.2-alpha, ``curvine-server/src/worker/handler/``; docs/sources.md
§19): ``read_handler.rs`` line 127 (the ``Read ...-block start`` message built at 104-113) and
205; ``write_handler.rs`` line 141 (``Write ...-block start``, built at 117-125) and 265-271. Each
is written as ``<time> <LEVEL> <module>.rs:<line> <message>`` and a newline (orpc
``common/logger_format.rs`` ``LogFormatter::format_event`` with the ``LogConf`` defaults
``display_position`` true and ``display_thread`` false; the handlers run in no span); the time is
``YYYY/MM/DD HH:MM:SS.mmm`` (orpc ``common/local_time.rs``, 23 bytes).

The values in the messages: ``label`` is ``remote`` (the FUSE client never asks for a
short-circuit read or write: its identity never matches a Worker's, docs/l2-cache.md); ``req_id``
a random i64 (orpc ``Utils::req_id``: 8 bytes of a UUID v4); ``path`` the block file
``<data_dir>/<cluster_id>/active/b<d1>/b<d2>/blk_<block id>`` (``VfsDir::new``, ``BlockMeta::
get_block_dir``, ``get_name``); ``chunk_size`` the client's ``read_chunk_size`` /
``write_chunk_size``, 128 KiB; ``read len`` and ``block_size`` in orpc's
``ByteUnit::byte_to_string`` (one decimal, binary units); ``read_ahead`` ``true-1048576`` (the
client's default read-ahead, ``read_chunk_num`` 8 x 128 KiB).

What the model leaves out: the req_id and the block id are examples (a random i64 has 19 digits
nine times in ten and a minus sign half the time; a block id grows with the namespace's inode
ids), so a real line differs by a few bytes; the Worker's other INFO lines (start, registration,
a failed or slow read: WARN) are events, not per chunk; batch writes (``batch_write_handler.rs``,
Curvine's batch API, which the FUSE client does not use for LMCache's files) are not modelled;
nor the master's per-RPC audit lines, which the chart turns off
(:data:`k8s.curvine_config.MASTER_AUDIT_LOGGING`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

#: Levels in the order tracing compares them (``tracing::Level``); orpc's logger parses the
#: configured ``level`` with ``Level::from_str`` (case-insensitive) and falls back to INFO when
#: it cannot (``common/logger.rs``). A line is written when its level is at or above the one set.
LEVELS: Final = ("trace", "debug", "info", "warn", "error")
FALLBACK_LEVEL: Final = "info"
#: Bytes of the timestamp (``LocalTime::format_time``: ``{:04}/{:02}/{:02} {:02}:{:02}:{:02}.{:03}``).
EXAMPLE_TIME: Final = "2026/08/13 12:00:00.000"
#: Client defaults (``ClientConf::default``, curvine-common ``conf/client_conf.rs``): 128 KiB read
#: and write chunks, 8 read chunks of read-ahead, 128 MB blocks; orpc's byte units are binary.
CLIENT_CHUNK_BYTES: Final = 128 * 2**10
CLIENT_READ_AHEAD_BYTES: Final = 8 * CLIENT_CHUNK_BYTES
CLIENT_BLOCK_BYTES: Final = 128 * 2**20
#: An example req_id (19 digits, see the module docstring) and inode id (the 1,000,000th file of a
#: namespace; block id = inode id << 24 | block index, ``inode_id.rs``; one block per chunk file).
EXAMPLE_REQ_ID: Final = 4962768465676381896
EXAMPLE_INODE_ID: Final = 1_000_000
#: A 256-token chunk of Qwen2-7B (57,344 B of KV per token, bf16; FACTS §5, the reference model):
#: 14 MiB. LMCache's chunk metadata header adds a few bytes, no digit.
EXAMPLE_CHUNK_BYTES: Final = 256 * 57_344
#: The stated load: one line at 10 requests/s of the reference's 2,500-token prompts, LMCache's
#: 256-token chunks, TP 1. LMCache stores whole chunks only, so 9 chunk files per request, each
#: read (a hit) or written (a miss): 90 block operations/s on the Workers.
EXAMPLE_REQUESTS_PER_S: Final = 10
EXAMPLE_PROMPT_TOKENS: Final = 2500
EXAMPLE_CHUNK_TOKENS: Final = 256
SECONDS_PER_DAY: Final = 86_400
_UNITS: Final = ("B", "KB", "MB", "GB", "TB", "PB", "EB")


def byte_to_string(size: int) -> str:
    """orpc ``ByteUnit::byte_to_string`` (``common/byte_unit.rs``): ``"14.0MB"`` for 14 MiB,
    ``"128.0MB"`` for 128 MiB, ``"0"`` for 0."""
    if size == 0:
        return "0"
    groups = math.floor(math.log10(size) / math.log10(1024))
    if groups > len(_UNITS) - 1:
        return f"{size}B"
    return f"{size / 1024 ** groups:.1f}{_UNITS[groups]}"


def block_path(*, data_dir: str, cluster_id: str, block_id: int) -> str:
    """The Worker's file of a finalized block: ``<data_dir>/<cluster_id>/active/b<d1>/b<d2>/blk_<id>``
    with ``d1 = (id >> 48) & 0x1F`` and ``d2 = (id >> 32) & 0x1F`` (``BlockMeta::get_block_dir``)."""
    return f"{data_dir}/{cluster_id}/active/b{(block_id >> 48) & 0x1F}/b{(block_id >> 32) & 0x1F}/blk_{block_id}"


@dataclass(frozen=True)
class WorkerLine:
    """One log line of a Worker's block handler: where it is logged, at which level, and its text."""

    module: str
    line: int
    level: str
    message: str

    def render(self, time: str = EXAMPLE_TIME) -> str:
        """The line as written, with its newline."""
        return f"{time} {self.level.upper()} {self.module}.rs:{self.line} {self.message}\n"


def block_lines(operation: str, *, chunk_bytes: int, data_dir: str, cluster_id: str,
                req_id: int = EXAMPLE_REQ_ID, inode_id: int = EXAMPLE_INODE_ID) -> tuple[WorkerLine, WorkerLine]:
    """The two lines a Worker logs for one block ``operation`` (``"read"`` or ``"write"``) of a
    ``chunk_bytes``-long chunk file.

    Raises:
        ValueError: ``operation`` is neither ``read`` nor ``write``.
    """
    path = block_path(data_dir=data_dir, cluster_id=cluster_id, block_id=inode_id << 24)
    if operation == "read":
        return (WorkerLine("read_handler", 127, "info",
                           f'Read remote-block start req_id: {req_id}, path: "{path}", chunk_size: '
                           f"{CLIENT_CHUNK_BYTES}, read len: {byte_to_string(chunk_bytes)}, read_ahead: "
                           f"true-{CLIENT_READ_AHEAD_BYTES}"),
                WorkerLine("read_handler", 205, "info", f"Read block end for req_id {req_id}"))
    if operation == "write":
        return (WorkerLine("write_handler", 141, "info",
                           f'Write remote-block start req_id: {req_id}, path: "{path}", chunk_size: '
                           f"{CLIENT_CHUNK_BYTES}, off: 0, block_size: {byte_to_string(CLIENT_BLOCK_BYTES)}"),
                WorkerLine("write_handler", 265, "info",
                           f"write block end for req_id {req_id}, is commit: true, off: 0, len: {chunk_bytes}"))
    raise ValueError(f"operation {operation!r}: allowed values are 'read' and 'write'")


def effective_level(level: str) -> str:
    """The level orpc's logger runs at for a configured ``level`` (unknown names: INFO)."""
    return level.lower() if level.lower() in LEVELS else FALLBACK_LEVEL


def written(line: WorkerLine, level: str) -> bool:
    """Whether ``line`` is written by a process configured at ``level``."""
    return LEVELS.index(line.level) >= LEVELS.index(effective_level(level))


def bytes_per_block(operation: str, level: str, *, chunk_bytes: int = EXAMPLE_CHUNK_BYTES,
                    data_dir: str, cluster_id: str) -> int:
    """Bytes a Worker at ``level`` logs for one block ``operation`` (``read`` or ``write``)."""
    lines = block_lines(operation, chunk_bytes=chunk_bytes, data_dir=data_dir, cluster_id=cluster_id)
    return sum(len(line.render().encode("utf-8")) for line in lines if written(line, level))


def example_chunk_files_per_s() -> int:
    """Chunk files read or written per second under the stated load: 10 x (2,500 // 256) = 90."""
    return EXAMPLE_REQUESTS_PER_S * (EXAMPLE_PROMPT_TOKENS // EXAMPLE_CHUNK_TOKENS)


def bytes_per_day(operation: str, level: str, *, chunk_files_per_s: float, data_dir: str, cluster_id: str,
                  chunk_bytes: int = EXAMPLE_CHUNK_BYTES) -> float:
    """Bytes per day the Workers log when ``chunk_files_per_s`` chunk files are each read (or each
    written, ``operation``) every second, summed over the Workers that hold them."""
    per_block = bytes_per_block(operation, level, chunk_bytes=chunk_bytes, data_dir=data_dir, cluster_id=cluster_id)
    return per_block * chunk_files_per_s * SECONDS_PER_DAY
