#!/usr/bin/env bash
# A one-node Slurm cluster on this machine for tmpi's tests: munge, slurmctld and slurmd from
# Debian's slurm-wlm, no systemd, no cgroups. Everything it writes lives in $TMPI_SLURM_DIR
# (default /tmp/tmpi-slurm): the configuration, state, logs and pid files; the daemons it
# starts are stopped by those pid files and nothing else.
#
#   slurm.sh check   exit 0 if this machine can run it (root, slurmctld, slurmd, srun, munged)
#   slurm.sh install apt-get the packages (needs the package registry)
#   slurm.sh up      write the configuration, start munged (if no munged answers), slurmctld
#                    and slurmd; wait until the node is idle; print `export SLURM_CONF=...`
#   slurm.sh down    stop what `up` started
set -euo pipefail

DIR=${TMPI_SLURM_DIR:-/tmp/tmpi-slurm}
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF

check() {
  [ "$(id -u)" = 0 ] || { echo "slurm harness: needs root" >&2; return 1; }
  for b in slurmctld slurmd srun sinfo munged munge; do
    command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || { echo "slurm harness: $b not installed" >&2; return 1; }
  done
}

install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends munge slurm-wlm slurmctld slurmd slurm-client >/dev/null
}

write_conf() {
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
  cat > "$CONF" <<CONF
ClusterName=tmpitest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldPort=${TMPI_SLURM_PORT:-6817}
SlurmdPort=$(( ${TMPI_SLURM_PORT:-6817} + 1 ))
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=localhost NodeHostname=$(hostname) NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=tmpi Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

up() {
  check
  write_conf
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    if [ ! -s /etc/munge/munge.key ]; then
      mkdir -p /etc/munge
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 status=none
      chown munge:munge /etc/munge/munge.key 2>/dev/null || true
      chmod 400 /etc/munge/munge.key
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    mkdir -p "$DIR/munge"
    chown munge "$DIR/munge" 2>/dev/null || true
    su -s /bin/sh munge -c "/usr/sbin/munged --pid-file=$DIR/munge/munged.pid" 2>/dev/null ||
      /usr/sbin/munged --force --pid-file="$DIR/munge/munged.pid"
    for _ in $(seq 1 20); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.5; done
  fi
  alive "$DIR/slurmctld.pid" || /usr/sbin/slurmctld -f "$CONF"
  alive "$DIR/slurmd.pid" || /usr/sbin/slurmd -f "$CONF" -N localhost
  for _ in $(seq 1 60); do
    sinfo -h -o '%T' 2>/dev/null | grep -qE 'idle|mixed' && { echo "export SLURM_CONF=$CONF"; return 0; }
    sleep 0.5
  done
  echo "slurm harness: the node did not become idle; see $DIR/log" >&2
  return 1
}

down() {
  for f in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"; do
    if alive "$f"; then
      pid=$(cat "$f")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  done
  echo "slurm harness: stopped"
}

case "${1:-}" in
  check) check ;;
  install) install ;;
  up) up ;;
  down) down ;;
  *) echo "usage: $0 check|install|up|down" >&2; exit 2 ;;
esac
