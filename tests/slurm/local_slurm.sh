#!/usr/bin/env bash
# A single-node Slurm cluster of the test suite's own: munged, slurmctld and slurmd from
# Debian's packages, everything (config, key, sockets, state, logs) under one directory, on
# free ports, on 127.0.0.1 (no name resolution needed). Jobs then run as `SLURM_CONF=DIR/slurm.conf srun --overcommit --mpi=pmix -n N ...`.
#
#   tests/slurm/local_slurm.sh start DIR   # idempotent: stops a cluster left in DIR first
#   tests/slurm/local_slurm.sh stop DIR
set -euo pipefail
cmd=${1:?usage: local_slurm.sh start|stop DIR}
dir=$(mkdir -p "${2:?usage: local_slurm.sh start|stop DIR}" && cd "$2" && pwd)

stop() {
  for pidfile in "$dir"/slurmd.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
}

free_port() {  # a TCP port nobody listens on
  local port
  while :; do
    port=$((20000 + RANDOM % 20000))
    (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
  done
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "local_slurm.sh: unknown command '$cmd' (start|stop)" >&2; exit 2; }
for tool in munged slurmctld slurmd sinfo srun; do
  command -v "$tool" >/dev/null || { echo "local_slurm.sh: $tool not found; run tools/install_deps.sh" >&2; exit 2; }
done
stop
rm -rf "$dir/state" "$dir/spool"
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
chmod 700 "$dir/munge"

# munge: our own key and socket (no system daemon needed).
[ -f "$dir/munge/munge.key" ] || { dd if=/dev/urandom bs=1 count=1024 of="$dir/munge/munge.key" 2>/dev/null; chmod 400 "$dir/munge/munge.key"; }
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.sock" \
  --pid-file="$dir/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munge.seed"

host=$(hostname -s)
cat >"$dir/slurm.conf" <<CONF
ClusterName=trtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
ReturnToService=2
SlurmUser=root
SlurmdUser=root
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmdSpoolDir=$dir/spool
StateSaveLocation=$dir/state
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
NodeName=$host NodeAddr=127.0.0.1 NodeHostname=$host CPUs=$(getconf _NPROCESSORS_ONLN) State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
# slurmd always initialises its cgroup plugin; started by hand (not as a systemd unit) on a
# cgroup v2 system it must not ask systemd for a scope.
cat >"$dir/cgroup.conf" <<CONF
CgroupPlugin=autodetect
IgnoreSystemd=yes
CONF
export SLURM_CONF="$dir/slurm.conf"
slurmctld
slurmd
for _ in $(seq 100); do
  state=$(sinfo -h -o %t 2>/dev/null || true)
  [ "$state" = idle ] && { echo "local slurm up: SLURM_CONF=$SLURM_CONF"; exit 0; }
  sleep 0.2
done
echo "local_slurm.sh: the node did not become idle (state '$state'); logs in $dir" >&2
tail -5 "$dir"/slurmctld.log "$dir"/slurmd.log >&2 || true
stop
exit 1
