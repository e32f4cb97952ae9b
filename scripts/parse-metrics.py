#!/usr/bin/env python3
"""Parse a Prometheus text-format file (stdin) with the official Python client's parser and print
its families as JSON: [{"name", "type", "help", "samples": [{"name", "labels", "value"}]}].
The tests use it so that the metrics file is judged by a real Prometheus parser. Exits 1 with the
parser's message when the text does not parse."""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families

try:
    families = [
        {
            "name": f.name,
            "type": f.type,
            "help": f.documentation,
            "samples": [
                {"name": s.name, "labels": s.labels, "value": s.value} for s in f.samples
            ],
        }
        for f in text_string_to_metric_families(sys.stdin.read())
    ]
except Exception as e:  # the parser raises ValueError and others for bad text
    print(f"not Prometheus text format: {e!r}", file=sys.stderr)
    sys.exit(1)
json.dump(families, sys.stdout)
