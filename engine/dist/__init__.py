"""Distributed serving pieces: KV transfer frames, block export/import between pools, transports (inproc,
shm, tcp). Exports: Descriptor, KVLayout, Frame, FrameError, encode_frame, decode_frame, export_blocks,
import_blocks, and the transport pairs/ends (inproc_pair, ShmReceiver, ShmSender, TcpReceiver, TcpSender).
P/D serving (imported from their modules, they pull in the scheduler): engine.dist.workers (PrefillWorker,
DecodeWorker), engine.dist.router (Router), engine.dist.cluster (PDCluster: admit/Handle like a scheduler), engine.dist.stats (PDCollector:
fak_pd_* metrics over cluster.stats()).
"""

from engine.dist.blocks import export_blocks, import_blocks
from engine.dist.frame import (
           Descriptor,
           Frame,
           FrameError,
           KVLayout,
           decode_frame,
           encode_frame,
)
from engine.dist.shm import ShmReceiver, ShmSender
from engine.dist.tcp import TcpReceiver, TcpSender
from engine.dist.transport import (
           TransportClosed,
           TransportError,
           TransportTimeout,
           inproc_pair,
)

__all__ = ["Descriptor", "Frame", "FrameError", "KVLayout", "ShmReceiver", "ShmSender", "TcpReceiver", "TcpSender",
           "TransportClosed", "TransportError", "TransportTimeout", "decode_frame", "encode_frame", "export_blocks",
           "import_blocks", "inproc_pair"]
