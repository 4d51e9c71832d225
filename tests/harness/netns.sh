#!/usr/bin/env bash
# netns.sh — "hosts" for tests/tests/multihost.rs: N network namespaces on one bridge, an sshd
# in each, all state in one private directory.
#
#   netns.sh up STATE N     namespaces tmpi-<tag>-h1..hN (tag = STATE's name), addresses
#                           10.77.0.1..N/24; h1 holds the bridge, the others a veth to it;
#                           then one sshd per namespace (key-only, root, own config and pid file
#                           in STATE). Writes STATE/hosts (one "namespace address" per line)
#                           and STATE/rsh (the ssh command for TMPI_RSH).
#   netns.sh down STATE     stops the sshds it started (by the pids in STATE) and whatever
#                           still runs in the namespaces it made (a test's ssh sessions and
#                           ranks on a host it cut off), deletes those namespaces (listed in
#                           STATE/namespaces), removes STATE.
#
# The addresses exist only inside the namespaces: the root namespace gets no address and no
# route to them, so nothing sent here can leave the test's own namespaces. Needs root,
# iproute2 (ip, bridge support), openssh-server and openssh-client.
set -euo pipefail

cmd=${1:-}
STATE=${2:-}
[[ -n "$cmd" && -n "$STATE" ]] || { echo "usage: $0 up STATE N | down STATE" >&2; exit 2; }

down() {
  [[ -d "$STATE" ]] || return 0
  for pidfile in "$STATE"/sshd_*.pid; do
    [[ -f "$pidfile" ]] || continue
    pid=$(cat "$pidfile")
    # Only an sshd we started: its command line names our config.
    if [[ -n "$pid" ]] && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$STATE/sshd_"; then
      kill "$pid" 2>/dev/null || true
    fi
  done
  if [[ -f "$STATE/namespaces" ]]; then
    while read -r ns; do
      [[ -n "$ns" ]] || continue
      # Only processes inside a namespace this harness made: what the tests started there.
      for pid in $(ip netns pids "$ns" 2>/dev/null); do
        kill -KILL "$pid" 2>/dev/null || true
      done
      ip netns del "$ns" 2>/dev/null || true
    done < "$STATE/namespaces"
  fi
  rm -rf "$STATE"
}

up() {
  local n=${1:-2}
  [[ "$n" -ge 2 && "$n" -le 9 ]] || { echo "netns.sh: 2..9 hosts" >&2; exit 2; }
  [[ $(id -u) -eq 0 ]] || { echo "netns.sh: needs root" >&2; exit 3; }
  command -v ip >/dev/null || { echo "netns.sh: no ip (iproute2)" >&2; exit 3; }
  [[ -x /usr/sbin/sshd ]] || { echo "netns.sh: no /usr/sbin/sshd (openssh-server)" >&2; exit 3; }
  command -v ssh >/dev/null || { echo "netns.sh: no ssh (openssh-client)" >&2; exit 3; }
  mkdir -p "$STATE" /run/sshd
  chmod 700 "$STATE"
  : > "$STATE/namespaces"
  : > "$STATE/hosts"
  local tag
  tag=$(basename "$STATE" | tr -c 'a-zA-Z0-9\n' '-' | cut -c1-20)
  local h1="tmpi-$tag-h1"
  for i in $(seq 1 "$n"); do
    ip netns add "tmpi-$tag-h$i"
    echo "tmpi-$tag-h$i" >> "$STATE/namespaces"
    ip -n "tmpi-$tag-h$i" link set lo up
  done
  ip -n "$h1" link add br0 type bridge
  ip -n "$h1" addr add 10.77.0.1/24 dev br0
  ip -n "$h1" link set br0 up
  echo "$h1 10.77.0.1" >> "$STATE/hosts"
  for i in $(seq 2 "$n"); do
    local ns="tmpi-$tag-h$i"
    # The pair is made directly inside the namespaces, never in the root namespace.
    ip link add "veth$i" netns "$ns" type veth peer name "port$i" netns "$h1"
    ip -n "$h1" link set "port$i" master br0
    ip -n "$h1" link set "port$i" up
    ip -n "$ns" addr add "10.77.0.$i/24" dev "veth$i"
    ip -n "$ns" link set "veth$i" up
    echo "$ns 10.77.0.$i" >> "$STATE/hosts"
  done

  ssh-keygen -q -t ed25519 -N '' -f "$STATE/id_ed25519"
  ssh-keygen -q -t ed25519 -N '' -f "$STATE/host_ed25519"
  cp "$STATE/id_ed25519.pub" "$STATE/authorized_keys"
  while read -r ns addr; do
    cat > "$STATE/sshd_$ns.conf" <<EOF
ListenAddress $addr
Port 22
HostKey $STATE/host_ed25519
PidFile $STATE/sshd_$ns.pid
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
EOF
    ip netns exec "$ns" /usr/sbin/sshd -f "$STATE/sshd_$ns.conf" -E "$STATE/sshd_$ns.log" </dev/null
  done < "$STATE/hosts"
  echo "ssh -F /dev/null -i $STATE/id_ed25519 -l root -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR -o ConnectTimeout=5" > "$STATE/rsh"
  # Wait (bounded) until every sshd answers from h1.
  local rsh
  rsh=$(cat "$STATE/rsh")
  while read -r _ addr; do
    local ok=0
    for _ in $(seq 1 50); do
      # shellcheck disable=SC2086
      if ip netns exec "$h1" $rsh "$addr" true </dev/null 2>/dev/null; then ok=1; break; fi
      sleep 0.1
    done
    [[ $ok -eq 1 ]] || { echo "netns.sh: sshd on $addr does not answer" >&2; cat "$STATE"/sshd_*.log >&2 || true; exit 4; }
  done < "$STATE/hosts"
  echo "up: $(tr '\n' ' ' < "$STATE/hosts")"
}

case "$cmd" in
  up) up "${3:-2}" ;;
  down) down ;;
  *) echo "usage: $0 up STATE N | down STATE" >&2; exit 2 ;;
esac
