#!/usr/bin/env bash
# Stops the servers started by start-local.sh.
set -euo pipefail
D="${1:-./lode-data}"
for t in ost1 ost0 mdt0 mgs; do
    if [ -f "$D/$t.pid" ]; then
        kill "$(cat "$D/$t.pid")" 2>/dev/null || true
        rm -f "$D/$t.pid"
    fi
done
echo "stopped"
