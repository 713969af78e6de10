"""Print each frame of a capture as one JSON object per line: its kind (contribution, result, request,
stats, malformed or other) and its header fields and elements."""

import json

from ..decode import describe_frame
from ..pcap import read_frames


def add_arguments(parser):
    parser.add_argument("capture", help="pcap or pcapng file of Ethernet frames")


def run(args):
    for index, frame in enumerate(read_frames(args.capture)):
        print(json.dumps({"frame": index, **describe_frame(frame)}))
    return 0
