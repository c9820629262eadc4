#!/usr/bin/env bash
# Runs Klaxon end to end: starts Redis, RabbitMQ and a MongoDB stand-in when
# they do not answer, runs the worker, publishes sample events and prints
# the notifications as they arrive.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
ensure_services
mkdir -p bin
go build -o bin/klaxon-worker ./cmd/worker
go build -o bin/klaxon ./cmd/klaxon
go build -o bin/devmongo ./cmd/devmongo
go build -o bin/klaxon-demo ./cmd/demo
exec bin/klaxon-demo "$@"
