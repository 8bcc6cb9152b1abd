#!/usr/bin/env bash
# Really run docker-compose.yml and check the demo cluster works end to end:
# a leading master, 3 agents, the demo app healthy, the word count correct, and a
# standby taking over when the leading master is killed with the app still running.
#
# Needs root on Debian (it installs docker.io, docker-compose and debootstrap and
# starts its own dockerd with a private data root and socket). Where no image
# registry is reachable it builds the base image with debootstrap; pip inside the
# build installs wheels pre-built here, so no CA bundle has to enter the image.
#
# DYAD_SKIP_COMPOSE=1 skips it (say so loudly); any failure exits non-zero.
# DYAD_COMPOSE_SECURE=1 runs the secured demo (docker-compose.secure.yml on top):
# the same checks over HTTPS with the cluster's CA and the operator's token.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${DYAD_SKIP_COMPOSE:-0}" = "1" ]; then
  echo "compose smoke: SKIPPED because DYAD_SKIP_COMPOSE=1" >&2
  exit 0
fi
fail() { echo "compose smoke: FAILED: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root to install and run dockerd"

started=$(date +%s)
work=$(mktemp -d /tmp/dyad-compose.XXXXXX)
export DOCKER_HOST="unix://$work/docker.sock"
project=dyadsmoke
files=(-f docker-compose.yml)
scheme=http
if [ "${DYAD_COMPOSE_SECURE:-0}" = "1" ]; then
  files+=(-f docker-compose.secure.yml)
  scheme=https
fi
compose() { docker-compose -p "$project" "${files[@]}" "$@"; }
api() {  # curl a Dyad API from the host, with the CA and a token when secured
  if [ "$scheme" = https ]; then
    curl -fs --cacert "$work/ca.pem" -H "Authorization: Bearer $(cat "$work/operator.token")" "$@"
  else
    curl -fs "$@"
  fi
}

# Every mount at or below $1, deepest first. dockerd leaves exec/netns/default
# mounted when it exits, and overlay and shm mounts under data/ when it dies hard.
mounts_under() {
  awk -v root="$1" '$5 == root || index($5, root "/") == 1 {print $5}' /proc/self/mountinfo \
    | sort -r
}
unmount_all() {  # succeeds only when nothing is left mounted below $1
  local target round
  for round in 1 2 3; do  # a stacked mount shows one line per layer; retry for late ones
    [ -z "$(mounts_under "$1")" ] && return 0
    for target in $(mounts_under "$1"); do
      umount "$target" 2>/dev/null || umount -l "$target" 2>/dev/null || true
    done
  done
  [ -z "$(mounts_under "$1")" ]
}

cleanup() {
  code=$?
  if [ "$code" != 0 ] && [ -S "$work/docker.sock" ]; then
    compose ps || true
    compose logs --tail=40 || true
  fi
  [ -S "$work/docker.sock" ] && compose down -v --remove-orphans >/dev/null 2>&1 || true
  if [ -f "$work/docker.pid" ]; then
    pid=$(cat "$work/docker.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do [ -e "/proc/$pid" ] || break; sleep 0.2; done
  fi
  # Never rm -rf through a mount: if one stays, say so, keep $work and fail.
  if unmount_all "$work"; then
    rm -rf "$work"
  else
    echo "compose smoke: still mounted under $work:" $(mounts_under "$work") >&2
    [ "$code" != 0 ] || code=1
  fi
  rm -rf docker/wheels
  exit "$code"
}
trap cleanup EXIT

echo "compose smoke: installing docker.io, docker-compose, debootstrap"
missing=""
command -v dockerd >/dev/null || missing="$missing docker.io"
command -v docker-compose >/dev/null || missing="$missing docker-compose"
command -v debootstrap >/dev/null || missing="$missing debootstrap"
command -v curl >/dev/null || missing="$missing curl"
if [ -n "$missing" ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null; } \
    || fail "could not install$missing"
fi

echo "compose smoke: starting a private dockerd"
dockerd --data-root "$work/data" --exec-root "$work/exec" --pidfile "$work/docker.pid" \
  --host "$DOCKER_HOST" >"$work/dockerd.log" 2>&1 &
for _ in $(seq 1 100); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
docker info >/dev/null 2>&1 || { tail -20 "$work/dockerd.log"; fail "dockerd did not start"; }

base=python:3.11-slim-bookworm
zkbase=debian:bookworm-slim
if ! docker pull -q "$base" >/dev/null 2>&1 || ! docker pull -q "$zkbase" >/dev/null 2>&1; then
  echo "compose smoke: no registry reachable; building a bookworm base with debootstrap"
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  debootstrap --variant=minbase bookworm "$work/rootfs" "${mirror:-http://deb.debian.org/debian}" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; fail "debootstrap failed"; }
  tar -C "$work/rootfs" -c . | docker import - dyad-base:bookworm >/dev/null
  rm -rf "$work/rootfs"
  base=dyad-base:bookworm
  zkbase=dyad-base:bookworm
fi
export DYAD_BASE_IMAGE=$base DYAD_ZK_BASE_IMAGE=$zkbase

echo "compose smoke: building wheels on the host (the image installs them offline)"
rm -rf docker/wheels
python3 -m pip wheel -q -w docker/wheels . >/dev/null || fail "pip wheel failed"

echo "compose smoke: docker-compose build and up"
compose build -q >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; fail "build failed"; }
compose up -d >"$work/up.log" 2>&1 || { tail -30 "$work/up.log"; fail "up failed"; }

# wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds.
wait_for() {
  local limit=$1 what=$2; shift 2
  local deadline=$(( $(date +%s) + limit ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "timed out after ${limit}s waiting for $what"
    sleep 1
  done
  echo "compose smoke: ok: $what"
}
py() { python3 -c "$@"; }
leader_port() {  # prints 5050 or 5060: the published port of the leading master
  for port in 5050 5060; do
    if api "$scheme://127.0.0.1:$port/state" | py 'import json,sys; s=json.load(sys.stdin); sys.exit(0 if s.get("elected") else 1)'; then
      echo "$port"; return 0
    fi
  done
  return 1
}
agents_registered() {
  local port; port=$(leader_port) || return 1
  api "$scheme://127.0.0.1:$port/state" \
    | py 'import json,sys; s=json.load(sys.stdin); sys.exit(0 if len([a for a in s["agents"] if a.get("active", True)]) >= 3 else 1)'
}
app_healthy() {
  api "$scheme://127.0.0.1:8080/v2/apps/demo/web" \
    | py 'import json,sys; a=json.load(sys.stdin)["app"]; sys.exit(0 if a["tasksRunning"] >= 2 and a.get("tasksHealthy", 0) >= 2 else 1)'
}
running_task_ids() {
  api "$scheme://127.0.0.1:8080/v2/apps/demo/web/tasks" \
    | py 'import json,sys; print(" ".join(sorted(t["id"] for t in json.load(sys.stdin)["tasks"] if t.get("state", "TASK_RUNNING") == "TASK_RUNNING")))'
}
wordcount_done() {
  [ "$(docker inspect -f '{{.State.Status}}' "$(compose ps -q wordcount)")" = exited ]
}

if [ "$scheme" = https ]; then
  keys_made() { [ "$(docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$(compose ps -q keys)")" = "exited 0" ]; }
  wait_for 120 "the cluster's keys generated" keys_made
  docker cp "$(compose ps -q keys)":/keys/tls/ca.pem "$work/ca.pem"
  docker cp "$(compose ps -q keys)":/keys/tokens/operator.token "$work/operator.token"
fi
wait_for 240 "a leading master" leader_port
wait_for 120 "3 agents registered" agents_registered
wait_for 240 "the demo app running and healthy" app_healthy
wait_for 300 "the word count to finish" wordcount_done

code=$(docker inspect -f '{{.State.ExitCode}}' "$(compose ps -q wordcount)")
[ "$code" = 0 ] || { compose logs wordcount | tail -30; fail "word count exited with $code"; }
compose logs --no-color wordcount >"$work/wordcount.log"
expected=$(py '
import collections, glob
counts = collections.Counter()
for path in sorted(glob.glob("examples/data/*.txt")):
    counts.update(open(path).read().lower().split())  # as examples/wordcount.py splits
word, n = counts.most_common(1)[0]
print(f"{word}\t{n}")')
grep -qF "$expected" "$work/wordcount.log" \
  || { tail -20 "$work/wordcount.log"; fail "word count result lacks the expected top word '$expected'"; }
echo "compose smoke: ok: word count result correct (top word: $expected)"

before=$(running_task_ids)
old=$(leader_port)
victim=$([ "$old" = 5050 ] && echo master1 || echo master2)
echo "compose smoke: killing the leading master ($victim)"
compose kill "$victim" >/dev/null
standby_leads() { p=$(leader_port) && [ "$p" != "$old" ]; }
wait_for 60 "the standby to take over" standby_leads
wait_for 60 "3 agents re-registered with the new leader" agents_registered
after=$(running_task_ids)
[ -n "$before" ] && [ "$before" = "$after" ] || fail "app tasks changed across failover: '$before' -> '$after'"
echo "compose smoke: ok: app tasks unchanged across failover ($after)"

compose down -v --remove-orphans >/dev/null
echo "compose smoke: PASSED in $(( $(date +%s) - started ))s"
