#!/bin/sh
# `kimideploy host check` probe: run on the host as `sh -s -- MODEL_PATH`. Each section starts with
# `### name`; services/hosts/hostcheck.py parses them. Read-only: it changes nothing on the host.
MODEL_PATH="$1"
export PATH="$PATH:/usr/local/bin:/usr/sbin:/sbin"
as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}
k() {
  if command -v k3s >/dev/null 2>&1; then as_root k3s kubectl "$@"; else echo "k3s: not installed"; return 127; fi
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
echo '### memlock'
# What pods inherit: the container runtime's locked-memory limit (k3s embeds containerd).
for unit in k3s containerd; do
  systemctl show -p LimitMEMLOCK -p LoadState "$unit" 2>/dev/null | tr '\n' ' '; echo "unit=$unit"
done
echo '### fabricmanager'
systemctl is-active nvidia-fabricmanager 2>&1
echo '### infiniband'
# One line per port: device, port, state, link layer. KIMIDEPLOY_SYSFS points elsewhere in tests.
for path in "${KIMIDEPLOY_SYSFS:-/sys}"/class/infiniband/*/ports/*; do
  [ -r "$path/state" ] || continue
  device=$(basename "$(dirname "$(dirname "$path")")")
  echo "$device $(basename "$path") $(cut -d' ' -f2 "$path/state") $(cat "$path/link_layer" 2>/dev/null)"
done
echo '### fabric'
# Each GPU's NVLink fabric registration: bus id|state|status (from nvidia-smi -q's Fabric section).
nvidia-smi -q 2>/dev/null | awk '
  /^GPU / { gpu = $2 }
  /^ *Fabric *$/ { fabric = 1; next }
  fabric && /^ *State / { sub(/^[^:]*: */, ""); state = $0; next }
  fabric && /^ *Status / { sub(/^[^:]*: */, ""); print gpu "|" state "|" $0; fabric = 0 }'
echo '### cmdline'
cat /proc/cmdline
echo '### uvm-hmm'
cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm 2>/dev/null || echo unloaded
echo '### acs'
# ACS control of every device that has it (lspci shows it to root only): device, then the flags.
if ! command -v lspci >/dev/null 2>&1; then
  echo "lspci: not installed"
elif [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; then
  as_root lspci -vvv 2>/dev/null | awk '
    /^[0-9a-f]/ { device = $1 }
    /ACSCtl:/ { sub(/^[^:]*:[ \t]*/, ""); print device " " $0 }'
  echo "read"
else
  echo "lspci: ACS is shown to root only and sudo asks for a password"
fi
echo '### bar1'
# Per GPU: bus id, memory MiB, BAR1 MiB.
nvidia-smi -q -d MEMORY 2>/dev/null | awk '
  /^GPU / { gpu = $2 }
  /FB Memory Usage/ { want = "fb"; next }
  /BAR1 Memory Usage/ { want = "bar1"; next }
  /Total/ && want == "fb" { fb = $3; want = "" }
  /Total/ && want == "bar1" { print gpu " " fb " " $3; want = "" }'
echo '### topology'
nvidia-smi topo -m 2>&1
echo '### p2p-read'
nvidia-smi topo -p2p r 2>&1
echo '### peermem'
grep -c '^nvidia_peermem ' /proc/modules 2>/dev/null
echo '### end'
