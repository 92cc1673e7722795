#!/usr/bin/env bash
# egress-chat as a person uses it: a server and two clients (alice in
# rooms general and random, bob in general), each client in a tmux window
# of its own, driven with send-keys and read with capture-pane.
#
# What it does: both type; alice goes offline (ctrl-o), types, and comes
# back; alice types offline and is SIGKILLed, then started again on her
# store; the server is SIGKILLed while bob types, then started again on its
# store. What it checks on the screens: each line shown once, in order, on
# both clients; alice's and bob's own lines marked delivered; the unsent
# count back to 0; and in the server's table each line stored once.
#
# Every wait is for something on a screen, with a deadline (20 s); on any
# mismatch the script prints the screens it saw and exits non-zero.
#
# usage: bash crates/egress-chat/tests/tmux.sh [path/to/egress-chat]
#        (EGRESS_CHAT_SCREEN=FILE keeps alice's screen while she is offline:
#        the README's picture, see docs/chat.md)
set -euo pipefail
cd "$(dirname "$0")/../../.."
bin=${1:-}
if [ -z "$bin" ]; then
  cargo build --quiet --locked -p egress-chat
  bin=$PWD/target/debug/egress-chat
fi
command -v tmux >/dev/null || { echo "tmux.sh: tmux is not installed" >&2; exit 1; }

dir=$(mktemp -d)
sock="$dir/tmux.sock"
t() { tmux -S "$sock" "$@"; }
server_pid=
cleanup() {
  t kill-server 2>/dev/null || true
  if [ -n "$server_pid" ]; then kill -9 "$server_pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

fail() {
  echo "tmux.sh: FAILED: $*" >&2
  for w in alice bob; do
    echo "---- $w's screen ----" >&2
    t capture-pane -p -t "chat:$w" >&2 2>/dev/null || echo "(no window)" >&2
  done
  echo "---- server log (last lines) ----" >&2
  tail -n 20 "$dir/server.log" >&2 2>/dev/null || true
  exit 1
}

screen() { t capture-pane -p -t "chat:$1"; }

# Waits until window $1's screen matches the extended regex $2.
wait_for() {
  local deadline=$((SECONDS + 20))
  until screen "$1" | grep -Eq -- "$2"; do
    [ $SECONDS -lt $deadline ] || fail "$1's screen never showed /$2/"
    sleep 0.1
  done
}

# Starts the server on the ports of its first run (0: any), and records
# them.
start_server() {
  "$bin" serve --listen "127.0.0.1:${ws_port:-0}" --push "127.0.0.1:${push_port:-0}" \
    --db "$dir/server.db" --log "$dir/server.log" >"$dir/server.out" 2>&1 &
  server_pid=$!
  disown "$server_pid"
  local deadline=$((SECONDS + 20))
  until grep -qs "push on" "$dir/server.out"; do
    [ $SECONDS -lt $deadline ] || fail "the server did not start: $(cat "$dir/server.out")"
    sleep 0.1
  done
  ws_port=$(sed -n 's/.*egress on 127.0.0.1:\([0-9]*\),.*/\1/p' "$dir/server.out")
  push_port=$(sed -n 's/.*push on 127.0.0.1:\([0-9]*\).*/\1/p' "$dir/server.out")
}

client() { # name, rooms...
  local name=$1
  shift
  local rooms=()
  for r in "$@"; do rooms+=(--room "$r"); done
  echo "$bin --name $name ${rooms[*]} --server 127.0.0.1:$ws_port --push 127.0.0.1:$push_port --db $dir/$name.db --log $dir/$name.log"
}

say() { # window, text
  t send-keys -t "chat:$1" -l "$2"
  t send-keys -t "chat:$1" Enter
}

start_server
t new-session -d -s chat -n alice -x 110 -y 30 "$(client alice general random)"
# A window whose client is killed stays, to be started again in place.
t set-option -t chat remain-on-exit on >/dev/null
t new-window -t chat -n bob "$(client bob general)"
wait_for alice "updates: live"
wait_for bob "updates: live"

# Both type.
say alice "a1-hello"
wait_for alice "alice: a1-hello +\[delivered\]"
say bob "b1-hi"
wait_for bob "bob: b1-hi +\[delivered\]"
wait_for alice "bob: b1-hi"
wait_for bob "alice: a1-hello"

# Alice offline: her line waits, queued; bob does not see it.
t send-keys -t chat:alice C-o
wait_for alice "send: offline"
say alice "a2-offline"
wait_for alice "a2-offline +\[queued\]"
wait_for alice "unsent 1"
# The README's picture is this screen: `EGRESS_CHAT_SCREEN=FILE` keeps it
# (cargo run -p xtask -- screen-svg FILE docs/chat.svg draws it).
if [ -n "${EGRESS_CHAT_SCREEN:-}" ]; then screen alice >"$EGRESS_CHAT_SCREEN"; fi
! screen bob | grep -q "a2-offline" || fail "bob saw alice's line while she was offline"
# Back online: it flows.
t send-keys -t chat:alice C-o
wait_for alice "a2-offline +\[delivered\]"
wait_for bob "alice: a2-offline"
wait_for alice "unsent 0"

# Alice types offline, then is killed: her line is in her store.
t send-keys -t chat:alice C-o
wait_for alice "send: offline"
say alice "a3-before-kill"
wait_for alice "a3-before-kill +\[queued\]"
kill -9 "$(t display -p -t chat:alice '#{pane_pid}')"
t respawn-window -k -t chat:alice "$(client alice general random)"
wait_for alice "a3-before-kill +\[delivered\]"
wait_for bob "alice: a3-before-kill"
wait_for alice "unsent 0"

# The server is killed while bob types: his line waits, then flows.
kill -9 "$server_pid"
deadline=$((SECONDS + 20))
while kill -0 "$server_pid" 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || fail "the killed server did not exit"
  sleep 0.05
done
say bob "b2-server-down"
wait_for bob "b2-server-down +\[(saving|queued|sending|retrying)\]"
wait_for bob "unsent 1"
# The status bar counts down to the next attempt (the view reads the clock
# only while it shows a countdown).
wait_for bob "reconnecting in [0-9]+ s"
start_server
wait_for bob "b2-server-down +\[delivered\]"
wait_for alice "bob: b2-server-down"
wait_for bob "unsent 0"
wait_for alice "unsent 0"

# Each line once, in order, on both screens.
want="a1-hello b1-hi a2-offline a3-before-kill b2-server-down"
for w in alice bob; do
  got=$(screen "$w" | grep -oE "(a1-hello|b1-hi|a2-offline|a3-before-kill|b2-server-down)" | tr '\n' ' ' | sed 's/ $//')
  [ "$got" = "$want" ] || fail "$w's screen shows [$got], not [$want]"
  own=$(screen "$w" | grep -cE "^│.*│$w: [a-z0-9-]+ +\[delivered\]" || true)
  total=$(screen "$w" | grep -cE "│$w: " || true)
  [ "$own" = "$total" ] || fail "$w's own lines: $own of $total marked delivered"
done
# And in the server's table, each line once.
if command -v python3 >/dev/null; then
  stored=$(python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute('SELECT COUNT(*), COUNT(DISTINCT text) FROM chat_message').fetchone())" "$dir/server.db")
  [ "$stored" = "(5, 5)" ] || fail "the server stored $stored lines (rows, distinct), not (5, 5)"
fi
echo "tmux.sh: OK: 5 lines, each once and in order on both screens, own lines delivered, unsent 0, through offline, a client SIGKILL and a server SIGKILL"
screen alice
