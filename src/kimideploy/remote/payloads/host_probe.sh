#!/bin/sh
# `kimideploy host check` probe: run on the host as `sh -s -- MODEL_PATH`. Each section starts with
# `### name`; services/hosts/hostcheck.py parses them. Read-only: it changes nothing on the host.
MODEL_PATH="$1"
export PATH="$PATH:/usr/local/bin:/usr/sbin:/sbin"
k() {
  if command -v k3s >/dev/null 2>&1; then sudo -n k3s kubectl "$@"; else echo "k3s: not installed"; return 127; fi
}
QUERY=index,name,compute_cap,driver_version,memory.total,persistence_mode,ecc.mode.current,clocks_event_reasons.active

echo '### gpus'
nvidia-smi --query-gpu="$QUERY" --format=csv,noheader 2>&1; echo "rc=$?"
echo '### banner'
nvidia-smi 2>&1 | head -n 6
echo '### disk'
mkdir -p "$MODEL_PATH" 2>/dev/null; df -P -B1 "$MODEL_PATH" 2>&1 | tail -n 1
echo '### marker'
ls "$MODEL_PATH"/hub/*/*/*/.kimideploy-complete 2>/dev/null
echo '### runtime'
command -v nvidia-container-runtime 2>&1; echo "rc=$?"
echo '### node'
k get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status} {.status.allocatable.nvidia\.com/gpu}{"\n"}{end}' 2>&1
echo "rc=$?"
echo '### device-plugin'
k -n kube-system get ds -l app.kubernetes.io/name=nvidia-device-plugin \
  -o jsonpath='{range .items[*]}{.status.numberReady}/{.status.desiredNumberScheduled}{"\n"}{end}' 2>&1
echo "rc=$?"
echo '### fabricmanager'
systemctl is-active nvidia-fabricmanager 2>&1
echo '### infiniband'
cat /sys/class/infiniband/*/ports/*/state 2>/dev/null; echo "rc=$?"
echo '### peermem'
grep -c '^nvidia_peermem ' /proc/modules 2>/dev/null
echo '### end'
