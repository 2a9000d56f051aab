"""Reads a shoal stream over Server-Sent Events with httpx-sse, printing one JSON line per event:
{"id": ..., "event": ..., "data": ...}. Used by tests/it/http.rs.

usage: sse_stream.py URL COUNT SECONDS [LAST_EVENT_ID]
  reads COUNT events, giving up after SECONDS; a COUNT of records:N reads a merged stream's
  events (each a JSON array of records) until they held N records.
"""
import json
import sys

import httpx
from httpx_sse import connect_sse

url, count, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
headers = {"Last-Event-ID": sys.argv[4]} if len(sys.argv) > 4 else {}
records = int(count.removeprefix("records:")) if count.startswith("records:") else None
count = None if records is not None else int(count)

with httpx.Client(timeout=httpx.Timeout(seconds)) as client:
    with connect_sse(client, "GET", url, headers=headers) as source:
        source.response.raise_for_status()
        read, held = 0, 0
        for sse in source.iter_sse():
            print(json.dumps({"id": sse.id, "event": sse.event, "data": sse.data}), flush=True)
            read += 1
            if records is not None and sse.event == "message":
                held += len(json.loads(sse.data))
            if (count is not None and read >= count) or (records is not None and held >= records):
                break
