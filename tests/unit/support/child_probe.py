"""A module the fork server's tests start: reports what it was given, then exits as told."""

import json
import os
import sys
import time

if __name__ == "__main__":
    action = sys.argv[1]
    print(
        json.dumps(
            {
                "argv": sys.argv[1:],
                "cwd": os.getcwd(),
                "probe": os.environ.get("PROBE"),
                "preloaded": "faust" in sys.modules,
                "project_imported": any(m.split(".")[0] in ("services", "shared") for m in sys.modules),
                "main": __name__,
                "path": sys.path,
            }
        ),
        flush=True,
    )
    if action == "sleep":
        time.sleep(60)
    elif action == "fail":
        raise ValueError("probe failure")
    sys.exit(int(action))
