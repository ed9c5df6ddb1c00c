"""Bytes between processes: KV transfer frames (versioned, model-named, checksummed), block export/import
between pools, transports (inproc, shm, tcp), channels, the one link that carries a header and a blob, node
plumbing. Exports: Descriptor, KVLayout, Frame, FrameError, encode_frame, decode_frame, export_blocks,
import_blocks, the transport ends (inproc_pair, ShmReceiver, ShmSender, TcpReceiver, TcpSender) and errors.
"""

from engine.wire.blocks import export_blocks, import_blocks
from engine.wire.frame import Descriptor, Frame, FrameError, KVLayout, decode_frame, encode_frame
from engine.wire.shm import ShmReceiver, ShmSender
from engine.wire.tcp import TcpReceiver, TcpSender
from engine.wire.transport import TransportClosed, TransportError, TransportTimeout, inproc_pair

__all__ = ["Descriptor", "Frame", "FrameError", "KVLayout", "ShmReceiver", "ShmSender", "TcpReceiver", "TcpSender",
           "TransportClosed", "TransportError", "TransportTimeout", "decode_frame", "encode_frame", "export_blocks",
           "import_blocks", "inproc_pair"]
