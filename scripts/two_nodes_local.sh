#!/usr/bin/env bash
# Two trainer nodes on one box: what a two-machine run does, with the loopback interface as the network.
#
# A two-node Ray cluster on 127.0.0.1 (`ray start --head` and a second node joining it by `ray start --address`, each
# with its own logical CPUs) and two node processes, NODE_RANK 0 and 1, joined by torch.distributed at 127.0.0.1 as
# Lightning's launcher joins the nodes of a cluster. Node 0's rank 0 runs the controller, the engines and the
# TransferQueue data plane on the Ray cluster; node 1's ranks join the cluster by RAY_ADDRESS and read their rows
# from the data plane. Everything this script starts ends with it (Ctrl-C included). See docs/distributed.md.
#
#   scripts/two_nodes_local.sh --config configs/grpo_tiny.yaml --data_plane.backend simple --grpo.max_num_steps 4
#   scripts/two_nodes_local.sh ... --policy.megatron_cfg.tensor_model_parallel_size 2   # TP=2 across the nodes
#
# The arguments go to `python -m sc_lightning fit` on both nodes, with `--trainer.num_nodes 2 --trainer.devices
# $RANKS_PER_NODE` added. Environment: RANKS_PER_NODE (trainer ranks per node, default 1), LAUNCHER (`lightning`, the
# default: the node's first rank starts the others, NODE_RANK set; or `torchrun`: --nnodes 2 --node-rank N), PYTHON
# (default .venv/bin/python), RAY_HEAD_CPUS and RAY_NODE1_CPUS (each Ray node's logical CPUs, default 2; a head with 0
# runs no actor, so the engines and the data plane all live on the second node), RAY_PORT and MASTER_PORT (default:
# free ports), TWO_NODES_DIR (the Ray nodes' output, default a new temporary directory; kept when given),
# FAILED_NODE_GRACE_S (how long a node may take to end by itself once the other failed, default 60), RAY_CLUSTER (the
# address of a Ray cluster already running, e.g. one an earlier run's nodes left up: the node processes join it and
# no Ray node is started or stopped; its token in RAY_AUTH_TOKEN).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=$(command -v "${PYTHON:-.venv/bin/python}")
RAY="$(dirname "$PYTHON")/ray"
HEAD_CPUS=${RAY_HEAD_CPUS:-2}
NODE1_CPUS=${RAY_NODE1_CPUS:-2}
RANKS_PER_NODE=${RANKS_PER_NODE:-1}
LAUNCHER=${LAUNCHER:-lightning}
[[ $LAUNCHER == lightning || $LAUNCHER == torchrun ]] || { echo "error: LAUNCHER=$LAUNCHER: lightning or torchrun" >&2; exit 2; }
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
RAY_PORT=${RAY_PORT:-$(free_port)}
DIR=${TWO_NODES_DIR:-$(mktemp -d -t sc-two-nodes-XXXXXX)}
mkdir -p "$DIR"
RAY_DIR=$(mktemp -d -t sc-ray-XXXXXX)  # Ray's session files, in a short path: its sockets' paths are bounded
RAY_PIDS=()
NODE_PIDS=()

stop_all() {
  # The node processes first (their Ray drivers leave the cluster), then the second Ray node, then the head (a
  # Ray node whose head is gone waits half a minute for it), each within a deadline; `ray start --block` stops its
  # processes on SIGTERM. Each is then killed with the children it had: a node's other ranks (Lightning's launcher
  # and torchrun start them as its children) would otherwise outlive a node killed past its deadline, still waiting
  # for their peers and holding the script's output open.
  local pid children
  for pid in "${NODE_PIDS[@]}" $(printf '%s\n' "${RAY_PIDS[@]}" | tac); do
    children=$(pgrep -P "$pid" || true)
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    # shellcheck disable=SC2086  # one pid a word
    kill -KILL "$pid" $children 2>/dev/null || true
  done
}
trap 'stop_all; rm -rf "$RAY_DIR"; [[ -n "${TWO_NODES_DIR:-}" ]] || rm -rf "$DIR"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_ray_node() {  # <log> <cpus> <ray start arguments...>: start a Ray node, return once it runs (within 120 s)
  local log=$1 cpus=$2
  shift 2
  : >"$log"
  "$RAY" start --block --num-cpus="$cpus" --num-gpus=0 --temp-dir="$RAY_DIR" --disable-usage-stats "$@" \
    >"$log" 2>&1 &
  RAY_PIDS+=($!)
  for _ in $(seq 1200); do
    grep -q "Ray runtime started" "$log" && return 0
    kill -0 "$!" 2>/dev/null || break
    sleep 0.1
  done
  echo "error: the Ray node did not start ($*); its output:" >&2
  tail -n 30 "$log" >&2
  exit 1
}

# Ray's token authentication, as Ray's own clusters have by default: every node and process sends the token (from
# RAY_AUTH_TOKEN, or ~/.ray/auth_token, which the head creates when missing).
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
if [[ -n ${RAY_CLUSTER:-} ]]; then
  RAY_ADDRESS=$RAY_CLUSTER
  cluster="the running Ray cluster at $RAY_ADDRESS"
else
  start_ray_node "$DIR/ray-head.log" "$HEAD_CPUS" --head --port="$RAY_PORT" --include-dashboard=false \
    --system-config='{"prestart_worker_first_driver": false}'
  start_ray_node "$DIR/ray-node1.log" "$NODE1_CPUS" --address="127.0.0.1:$RAY_PORT"
  RAY_ADDRESS="127.0.0.1:$RAY_PORT"
  cluster="2 nodes at $RAY_ADDRESS ($HEAD_CPUS and $NODE1_CPUS CPUs)"
fi
MASTER_PORT=${MASTER_PORT:-$(free_port)}  # once Ray's processes hold their ports, so none takes it meanwhile
echo "Ray cluster: $cluster; trainer rendezvous 127.0.0.1:$MASTER_PORT" >&2

export RAY_ADDRESS MASTER_ADDR=127.0.0.1 MASTER_PORT
fit=(-m sc_lightning fit "$@" --trainer.num_nodes 2 --trainer.devices "$RANKS_PER_NODE")
for node in 0 1; do
  if [[ $LAUNCHER == torchrun ]]; then
    "$PYTHON" -m torch.distributed.run --nnodes 2 --nproc-per-node "$RANKS_PER_NODE" --node-rank "$node" \
      --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" "${fit[@]}" &
  else  # Lightning's launcher: the node's first rank starts the others
    NODE_RANK=$node "$PYTHON" "${fit[@]}" &
  fi
  NODE_PIDS+=($!)
done
# As the nodes end. When one fails the other's next collective fails too, and it ends with its own error within
# seconds; after FAILED_NODE_GRACE_S (default 60) it is stopped (on EXIT).
running=("${NODE_PIDS[@]}")
status=0
while [[ ${#running[@]} -gt 0 ]]; do
  code=0
  wait -n -p ended "${running[@]}" || code=$?
  left=()
  for pid in "${running[@]}"; do [[ $pid == "$ended" ]] || left+=("$pid"); done
  running=("${left[@]}")
  if [[ $code -ne 0 && $status -eq 0 ]]; then
    status=$code
    echo "error: node $([[ $ended == "${NODE_PIDS[0]}" ]] && echo 0 || echo 1) exited with code $code" >&2
    for _ in $(seq "$((${FAILED_NODE_GRACE_S:-60} * 10))"); do
      alive=0
      for pid in "${running[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
      ((alive)) || break
      sleep 0.1
    done
    break
  fi
done
exit "$status"
