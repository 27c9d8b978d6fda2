#!/usr/bin/env bash
# GPU exactness check: handoff parity with every layer offloaded to the GPU.
#
# Needs a GPU build of llama.cpp in place of the CPU package, from the same pinned release:
#   npm install --no-save @node-llama-cpp/linux-x64-cuda@3.21.1     # NVIDIA (CUDA)
#   npm install --no-save @node-llama-cpp/linux-x64-vulkan@3.21.1   # Vulkan
#   (macOS arm64: @node-llama-cpp/mac-arm64-metal@3.21.1 is the default package; Metal is in it)
# then point the runtime at its libraries:
#   export SKIPPY_LLAMA_LIB_DIR=$PWD/node_modules/@node-llama-cpp/linux-x64-cuda/bins/linux-x64-cuda
# On a machine without a GPU device it still runs: it says so, and checks the CPU path.
#
# Checks: `correctness state-handoff` (prefill on A, import on B, greedy continuation compared
# bit for bit, faults refused) for several families, and `demo` (a two-worker QUIC handoff
# whose tokens are compared with local generation). Last line: "N passed, M failed"; exit
# status 1 when anything failed.
#
# Usage: scripts/gpu-check.sh [--gpu-layers <n|all>] [--families a,b,c] [--prompt-tokens a,b]
# (defaults: all, dense,hybrid,hybrid-moe-mtp, 1024,4096; pages of 256 tokens, 8 steps).
set -u
cd "$(dirname "$0")/.."
DENO=./node_modules/.bin/deno
GPU_LAYERS=all
FAMILIES=dense,hybrid,hybrid-moe-mtp
PROMPT_TOKENS=1024,4096
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu-layers) GPU_LAYERS="$2"; shift 2 ;;
    --families) FAMILIES="$2"; shift 2 ;;
    --prompt-tokens) PROMPT_TOKENS="$2"; shift 2 ;;
    *) echo "usage: $0 [--gpu-layers <n|all>] [--families a,b,c] [--prompt-tokens a,b]" >&2
       exit 2 ;;
  esac
done

passed=0
failed=0
check() {
  local name="$1"; shift
  echo "== $name"
  if "$@"; then
    passed=$((passed + 1)); echo "-- pass: $name"
  else
    failed=$((failed + 1)); echo "-- FAIL: $name"
  fi
}

echo "== devices"
$DENO eval '
import { listDevices, loadLlama, offloadDevices } from "./ffi/mod.ts";
const lib = loadLlama();
const all = listDevices(lib);
for (const d of all) console.log(`  ${d.backend} ${d.type} ${d.name}: ${d.description}`);
const gpus = offloadDevices(all);
console.log(gpus.length === 0
  ? "  0 GPU devices: checking the CPU path (--gpu-layers resolves to 0)"
  : `  ${gpus.length} GPU device(s): layers offloaded to ${gpus.map((d) => d.description).join(", ")}`);
' || { echo "0 passed, 1 failed"; exit 1; }

IFS=, read -r -a FAMILY_LIST <<< "$FAMILIES"
for family in "${FAMILY_LIST[@]}"; do
  check "state-handoff $family --gpu-layers $GPU_LAYERS" \
    $DENO run -A --unstable-net main.ts correctness state-handoff \
      --families "$family" --gpu-layers "$GPU_LAYERS" --steps 8 \
      --prompt-tokens "$PROMPT_TOKENS" --page-tokens 256
done
check "demo: handoff tokens equal local generation (--gpu-layers $GPU_LAYERS)" \
  $DENO run -A --unstable-net main.ts demo --gpu-layers "$GPU_LAYERS" --repeat 4 -n 16

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
