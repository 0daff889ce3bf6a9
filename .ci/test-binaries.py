#!/usr/bin/env python3
"""The integration test binaries a `cargo test --no-run --message-format=json` built,
one per line: the folder of its package (where cargo runs it from), then its path."""
import json
import os
import sys

seen = set()
with open(sys.argv[1]) as artifacts:
    for line in artifacts:
        if not line.startswith("{"):
            continue
        message = json.loads(line)
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message["profile"]["test"] or message["target"]["kind"] != ["test"]:
            continue
        if message["executable"] in seen:
            continue
        seen.add(message["executable"])
        print(os.path.dirname(message["manifest_path"]), message["executable"])
