#!/usr/bin/env python3
"""Runs shellcheck on every shell script in the rendered user-data snapshots: each
`write_files` entry that starts with `#!/bin/sh`, and the `runcmd` list turned into one
`#!/bin/sh` script the way cloud-init's `util.shellify` does (strings as they are, argv lists
quoted word by word)."""
import shlex
import subprocess
import sys
import tempfile

import yaml

failed = False
for path in sys.argv[1:]:
    with open(path) as f:
        doc = yaml.safe_load(f)
    scripts = []
    for entry in doc.get("write_files") or []:
        content = entry.get("content") or ""
        if content.startswith("#!/bin/sh"):
            scripts.append((f"{path}:{entry['path']}", content))
    lines = ["#!/bin/sh"]
    for cmd in doc.get("runcmd") or []:
        if isinstance(cmd, list):
            lines.append(" ".join(shlex.quote(str(a)) for a in cmd))
        else:
            lines.append(cmd)
    scripts.append((f"{path}:runcmd", "\n".join(lines) + "\n"))
    for name, text in scripts:
        with tempfile.NamedTemporaryFile("w", suffix=".sh") as tmp:
            tmp.write(text)
            tmp.flush()
            result = subprocess.run(["shellcheck", "--shell=sh", tmp.name], capture_output=True, text=True)
        if result.returncode != 0:
            failed = True
            print(f"shellcheck failed on {name}:\n{result.stdout}{result.stderr}", file=sys.stderr)
        else:
            print(f"shellcheck ok: {name}")
sys.exit(1 if failed else 0)
