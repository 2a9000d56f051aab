"""Reads a shoal stream over WebSocket with the `websockets` client, printing one JSON line per
message: {"text": ...} for a text frame, {"binary_base64": ...} for a binary one; then
{"closed": CODE} if the server closed the connection. Used by tests/it/http.rs.

usage: ws_stream.py URL COUNT SECONDS [ORIGIN]
  reads COUNT messages (or until the server closes), giving up after SECONDS; a COUNT of
  records:N reads a merged stream's messages until they held N records.
"""
import asyncio
import base64
import json
import sys

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

url, count, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
records = int(count.removeprefix("records:")) if count.startswith("records:") else None
count = None if records is not None else int(count)
origin = sys.argv[4] if len(sys.argv) > 4 else None


def out(**kw):
    print(json.dumps(kw), flush=True)


async def main():
    async with connect(url, origin=origin, open_timeout=10, max_size=None) as ws:
        try:
            read, held = 0, 0
            while (count is not None and read < count) or (records is not None and held < records):
                m = await ws.recv()
                read += 1
                if isinstance(m, str):
                    out(text=m)
                    if records is not None:
                        held += len(json.loads(m).get("records", []))
                else:
                    out(binary_base64=base64.b64encode(m).decode())
        except ConnectionClosed as e:
            out(closed=e.rcvd.code if e.rcvd else None)


asyncio.run(asyncio.wait_for(main(), seconds))
