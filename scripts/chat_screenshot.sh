#!/usr/bin/env bash
# The web chat in a real browser: serve RUN's page, let headless Chromium open it with ?q=QUESTION (the page
# sends it on load), wait for the streamed answer, and save a screenshot.
#   scripts/chat_screenshot.sh RUN OUT.png ["What is 12 + 7?"] [PORT]
# Needs chromium (Debian: apt-get install -y chromium).
set -euo pipefail
run=${1:?usage: scripts/chat_screenshot.sh RUN OUT.png [QUESTION] [PORT]}
out=${2:?usage: scripts/chat_screenshot.sh RUN OUT.png [QUESTION] [PORT]}
question=${3:-What is 12 + 7?}
port=${4:-8765}
python=${PYTHON:-python}
"$python" -m speedgpt chat "$run" --serve --port "$port" --temperature 0 > "$out.server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _ in $(seq 1 120); do grep -q "chat page:" "$out.server.log" && break; sleep 1; done
grep -q "chat page:" "$out.server.log" || { echo "server did not start: $(cat "$out.server.log")" >&2; exit 1; }
# one answer first: the model's first forward is slow, and the browser's virtual clock does not wait for it
curl -s -X POST -H 'Content-Type: application/json' -d '{"messages": [{"role": "user", "content": "hi"}]}' \
  "http://127.0.0.1:$port/chat" > /dev/null
query=$("$python" -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$question")
chromium --headless --no-sandbox --disable-gpu --window-size=900,420 --virtual-time-budget=30000 --run-all-compositor-stages-before-draw \
  --screenshot="$out" "http://127.0.0.1:$port/?q=$query" 2>/dev/null
rm -f "$out.server.log"
echo "screenshot: $out"
